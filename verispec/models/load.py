"""Resolve a model argument (packaged name, GGUF file or Hugging Face directory) into a loaded model."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import torch

from verispec.models.errors import ModelError
from verispec.models.base import CausalLM
from verispec.models.llama import LlamaConfig, LlamaModel
from verispec.models.quant import QUANTIZED
from verispec.models.tokenizer import Tokenizer

DTYPES = {"bfloat16": torch.bfloat16, "bf16": torch.bfloat16, "float32": torch.float32, "fp32": torch.float32}


NATIVE_TYPES = ("llama", "qwen2", "mistral", "gemma3_text")


@dataclass
class LoadedModel:
    model: CausalLM
    tokenizer: Tokenizer
    path: Path  # the Hugging Face style directory actually loaded
    name: str


def resolve(spec: str, *, progress: bool = True) -> Path:
    """Packaged model name | path to .gguf | HF directory -> HF-style directory."""
    from verispec.models.packaged import PACKAGED, SINGLE_GGUF, resolve_packaged, single_gguf

    if spec in PACKAGED:
        return resolve_packaged(spec, progress=progress)
    path = single_gguf(spec) if spec in SINGLE_GGUF else Path(spec).expanduser()
    if not path.exists():
        names = ", ".join(sorted([*PACKAGED, *SINGLE_GGUF]))
        raise ModelError(f"no model at '{spec}': give a Hugging Face directory, a .gguf file, or one of: {names}")
    if path.is_file():
        from verispec.models.gguf_convert import convert_gguf

        return convert_gguf(path, progress=progress)
    if not (path / "config.json").is_file():
        raise ModelError(f"'{spec}' is a directory without config.json; expected a Hugging Face model directory")
    return path


def _available_bytes() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def _check_memory(path: Path, config: dict, dtype: torch.dtype) -> None:
    """Refuse early, with a clear message, rather than be killed by the OOM killer mid-load."""
    from verispec.models.llama import hf_weight_files  # the model's own weights, not our caches beside them

    n_bytes = sum(f.stat().st_size for f in hf_weight_files(path))
    stored = config.get("torch_dtype", "bfloat16")
    scale = torch.finfo(dtype).bits / torch.finfo(DTYPES.get(stored, torch.bfloat16)).bits
    need = int(n_bytes * scale)
    free = _available_bytes()
    if free is not None and need > free:
        raise ModelError(
            f"not enough memory to load {path.name}: needs about {need / 2**30:.1f} GiB as {dtype}, "
            f"{free / 2**30:.1f} GiB available"
        )


RANDOM_PREFIX = "random:"


def _load_random(spec: str, dtype: torch.dtype, device: str) -> LoadedModel:
    """`random:DIR`: the shapes of DIR's config.json with random weights, and DIR's tokenizer.

    For measuring speed where the real weights cannot go (a lent GPU machine takes 64 MiB): a config and a
    tokenizer are a few MB. Pair it with `bench --synthetic`, since random models agree on ~no token."""
    path = Path(spec[len(RANDOM_PREFIX):]).expanduser()
    try:
        cfg = LlamaConfig.from_hf(json.loads((path / "config.json").read_text()))
        tokenizer = Tokenizer.from_dir(path)
    except (OSError, ValueError) as e:
        raise ModelError(f"cannot read the config and tokenizer in {path}: {e}") from e
    seed = int.from_bytes(path.name.encode()[:4].ljust(4, b"\0"), "little")  # different models, different weights
    model = LlamaModel.random(cfg, seed=seed, dtype=dtype)
    with torch.no_grad():  # peaky logits (std ~40, not ~1): near-ties would make bf16 rounding flip argmaxes
        model.lm_head.weight.mul_(50.0)
    return LoadedModel(model=model.to(device), tokenizer=tokenizer, path=path, name=spec)


def load(spec: str, *, dtype: str | torch.dtype = "bfloat16", device: str = "cpu", progress: bool = True,
         tokenizer_like: Tokenizer | None = None) -> LoadedModel:
    """dtype: bfloat16 | float32, or int8 | int4 (weight-only quantized linears, bfloat16 activations; native
    models). spec: a packaged name, a .gguf file, a Hugging Face directory, or random:DIR (DIR's shapes, random
    weights). tokenizer_like: the other model's tokenizer, shared where both read the same tokenizer.json."""
    quantized = dtype if dtype in QUANTIZED else None
    torch_dtype = torch.bfloat16 if quantized else DTYPES[dtype] if isinstance(dtype, str) else dtype
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ModelError("--device cuda was asked for, but this PyTorch build sees no CUDA device")
    if quantized and (quantized in ("int4", "w8a8") or quantized.startswith("w4a8")) and device != "cpu":
        raise ModelError(f"{quantized} weights use CPU kernels: run them with --device cpu")
    if quantized == "w8a8":
        from verispec.models.kernels import w8a8_refusal

        refusal = w8a8_refusal()
        if refusal:
            raise ModelError(refusal)
    if quantized and quantized.startswith("w4a8"):  # build (or find) the kernel before minutes of conversion
        from verispec.models.kernels import KernelError, kernel_isa, w4a8

        try:
            w4a8(kernel_isa())
        except KernelError as e:
            raise ModelError(str(e)) from e
    if spec.startswith(RANDOM_PREFIX):
        if quantized:
            raise ModelError(f"random weights come in bfloat16 or float32, not {quantized}")
        return _load_random(spec, torch_dtype, device)
    path = resolve(spec, progress=progress)
    try:
        config = json.loads((path / "config.json").read_text())
    except (OSError, ValueError) as e:
        raise ModelError(f"cannot read {path / 'config.json'}: {e}") from e
    model_type = config.get("model_type")
    if quantized and model_type not in NATIVE_TYPES:
        raise ModelError(f"{quantized} weights need the native model; {path.name} is a {model_type} model")
    _check_memory(path, config, torch_dtype)
    try:
        if quantized:
            from verispec.models.quant import load_quantized_llama

            model: CausalLM = load_quantized_llama(path, quantized).to(device)
        elif model_type in NATIVE_TYPES:
            model = LlamaModel.from_hf_dir(path, dtype=torch_dtype, device=device)
        else:  # any other architecture runs through transformers
            from verispec.models.hf import HFCausalLM

            model = HFCausalLM.from_dir(path, dtype=torch_dtype, device=device)
    except (ValueError, KeyError, FileNotFoundError, OSError) as e:
        raise ModelError(f"cannot load model from {path}: {e}") from e
    try:
        tokenizer = Tokenizer.from_dir(path, like=tokenizer_like)
    except Exception as e:  # transformers raises many types for a broken tokenizer
        raise ModelError(f"cannot load the tokenizer in {path}: {e}") from e
    return LoadedModel(model=model, tokenizer=tokenizer, path=path, name=spec)


def check_pair(target: LoadedModel, draft: LoadedModel) -> None:
    """The draft must speak the target's vocabulary: same token strings for every id both define (the
    models' embedding tables may be padded differently) and the same end-of-sequence tokens."""
    if target.tokenizer.backend is not draft.tokenizer.backend:  # one tokenizer.json (load's tokenizer_like)
        _check_vocab(target, draft)
    if set(target.tokenizer.eos_ids) != set(draft.tokenizer.eos_ids):
        raise ModelError(
            f"incompatible pair: end-of-sequence tokens differ (target {target.tokenizer.eos_ids}, "
            f"draft {draft.tokenizer.eos_ids})"
        )
    if draft.model.vocab_size < len(target.tokenizer):
        raise ModelError("incompatible pair: the draft's output layer is smaller than the shared vocabulary")


def _check_vocab(target: LoadedModel, draft: LoadedModel) -> None:
    tv, dv = target.tokenizer.vocab(), draft.tokenizer.vocab()
    t_by_id = {i: s for s, i in tv.items()}
    d_by_id = {i: s for s, i in dv.items()}
    shared = set(t_by_id) & set(d_by_id)
    differing = [i for i in shared if t_by_id[i] != d_by_id[i]]
    only = len(set(t_by_id) ^ set(d_by_id))
    if differing or only:
        example = f" (e.g. id {differing[0]}: {t_by_id[differing[0]]!r} vs {d_by_id[differing[0]]!r})" if differing else ""
        raise ModelError(
            f"incompatible pair: the draft's vocabulary differs from the target's in {len(differing) + only} "
            f"tokens{example}; speculative decoding needs one shared tokenizer"
        )


OMP_BINDING = ("GOMP_CPU_AFFINITY", "OMP_PLACES", "OMP_PROC_BIND")


def threads_to_use(environ: Mapping[str, str] = os.environ) -> int | None:
    """The torch threads verispec runs: $OMP_NUM_THREADS where it is a positive number (what the user asked for);
    else every CPU this process may run on (torch sometimes picks fewer in containers). Where OpenMP binds threads
    ($GOMP_CPU_AFFINITY, $OMP_PLACES, $OMP_PROC_BIND), its runtime has bound this thread to the first place before
    verispec starts, so the process's affinity shows that place alone: then the CPUs the binding names (a list of
    CPUs and ranges, or of {...} places), or every CPU of the machine where it names none. Pinned with
    GOMP_CPU_AFFINITY="0 1" on a 2-core VM, verispec had run one thread, 1.35-1.45x slower
    (benchmarks/results/2026-12-02-zen5-avx512-levers). None where the platform tells nothing.

    >>> threads_to_use({"OMP_NUM_THREADS": "3"}), threads_to_use({"GOMP_CPU_AFFINITY": "0-3 8"})
    (3, 5)
    >>> threads_to_use({"OMP_PLACES": "{0},{1}", "OMP_PROC_BIND": "close"}), threads_to_use({"OMP_PLACES": "{0:4}"})
    (2, 4)
    """
    asked = environ.get("OMP_NUM_THREADS", "").strip()
    if asked.isdigit() and int(asked) > 0:
        return int(asked)
    bound = environ.get("OMP_PROC_BIND", "").strip().lower() != "false"  # false: no thread is bound
    for name in OMP_BINDING if bound else ():
        value = environ.get(name, "").strip()
        if value:
            return bound_cpus(value) or os.cpu_count()
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count()


def bound_cpus(binding: str) -> int | None:
    """How many CPUs an OpenMP binding names: GOMP_CPU_AFFINITY's "0 1", "0-3", "0-7:2", or OMP_PLACES' "{0},{1}",
    "{0:4}", "{0,1},{2,3}"; None for abstract ones ("cores", "true", "spread") or anything else."""
    cpus: set[int] = set()
    for group in re.findall(r"\{([^}]*)\}", binding) or [binding]:  # the {...} places, or the whole list
        for item in re.split(r"[,\s]+", group.strip()):
            m = re.fullmatch(r"(\d+)(?:-(\d+)(?::(\d+))?|:(\d+)(?::(\d+))?)?", item)
            if m is None:
                return None
            first = int(m[1])
            if m[2] is not None:  # a-b[:stride]
                cpus.update(range(first, int(m[2]) + 1, int(m[3] or 1)))
            elif m[4] is not None:  # first:count[:stride] (OMP_PLACES' interval)
                cpus.update(range(first, first + int(m[4]) * int(m[5] or 1), int(m[5] or 1)))
            else:
                cpus.add(first)
    return len(cpus) or None


def default_threads() -> None:
    """Set torch's threads to threads_to_use()."""
    threads = threads_to_use()
    if threads:
        torch.set_num_threads(threads)
