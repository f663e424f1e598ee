"""The default pair's draft or target as the default configuration runs it (w4a8; the draft's head cut to 65536
rows), its w4a8 matrices and their bytes: what the scripts in this folder measure."""
from verispec.models.load import default_threads, load
from verispec.models.packaged import DEFAULT_DRAFT, DEFAULT_TARGET
from verispec.models.quant import W4A8Linear, truncate_head


def model_and_linears(which: str):
    default_threads()
    model = load(DEFAULT_DRAFT if which == "draft" else DEFAULT_TARGET,
                 dtype="w4a8-4bit" if which == "draft" else "w4a8", progress=False).model
    if which == "draft":
        truncate_head(model, 65536)
    return model, [mod for mod in model.modules() if isinstance(mod, W4A8Linear)]


def weight_bytes(linears) -> int:
    return sum(l.weight.numel() + l.codes.numel() + l.units.numel() * 2 for l in linears)
