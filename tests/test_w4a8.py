"""verispec's 4-bit-weight x int8-activation CPU kernel (verispec/models/kernels/w4a8.cpp), on each of its builds
(AVX-512 VNNI, AVX2) that this machine can run: the tests that take an `isa` run once per build, and skip, with
the reason, the builds this CPU lacks (an AVX-512 machine runs both, so the AVX2 path is tested on any x86 CI)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.tiny_hf import make_tiny_hf_dir
from verispec.engine import GenerationParams, generate
from verispec.models import kernels
from verispec.models.errors import ModelError
from verispec.models.kernels import KernelError, w4a8
from verispec.models.load import load
from verispec.models.quant import W4A8Linear, affine_groups, cache_file, on_4bit_grid, w4a8_grid
from verispec.proposers.draft_model import DraftModelProposer

if not kernels.available_isas():  # neither AVX-512 VNNI nor AVX2: the dtype refuses (message: test_refusals_...)
    pytest.skip(f"no w4a8 kernel build runs on this CPU (lacks {', '.join(kernels.missing_cpu_flags('avx2'))})",
                allow_module_level=True)


def _build_or_skip(isa: str):
    missing = kernels.missing_cpu_flags(isa)
    if missing:
        pytest.skip(f"this CPU cannot run the {isa} build (lacks {', '.join(missing)})")
    try:
        return w4a8(isa)
    except KernelError as e:  # no compiler: the dtype refuses with this message
        pytest.skip(f"w4a8 kernel unavailable: {e}")


@pytest.fixture(params=kernels.ISAS)
def isa(request, monkeypatch) -> str:
    """Each kernel build in turn, chosen for W4A8Linear through $VERISPEC_KERNEL_ISA as a user would force it."""
    assert _build_or_skip(request.param).isa() == request.param
    monkeypatch.setenv(kernels.ISA_ENV, request.param)
    assert w4a8().isa() == request.param
    return request.param


def dequantized(layer: torch.nn.Linear, bits: int) -> torch.Tensor:
    """The weights as the kernel decodes them: codes times the decoded step plus the decoded offset (float32, exact)."""
    w = layer.weight.detach().float()
    q, s, o, _, _ = w4a8_grid(w, 2**bits - 1)
    n, k = w.shape
    return (q.reshape(n, k // 32, 32).float() * s[..., None] + o[..., None]).reshape(n, k)


@pytest.mark.parametrize("bits", [3, 4, 6, 8])
@pytest.mark.parametrize("rows", [1, 3, 8, 9, 17])
def test_kernel_matches_its_dequantized_weights_and_quantized_rows(isa, bits, rows):
    """Against a float64 reference with the same quantization (weights per group, activations per row): the only
    difference left is float32 accumulation order."""
    torch.manual_seed(rows)
    layer = torch.nn.Linear(640, 80, bias=True)  # 20 groups: two whole units of 8 groups and a part of one
    with torch.no_grad():
        layer.weight[:, 256:512] *= 8  # a unit whose groups span 8x the others'
    q = W4A8Linear(layer, bits=bits)
    x = torch.randn(rows, 640) * 3
    sx = x.abs().amax(-1, keepdim=True) / 127
    xq = torch.round(x * (1 / sx))
    ref = (xq.double() @ dequantized(layer, bits).double().T) * sx.double() + layer.bias.double()
    assert (q(x).double() - ref).abs().max() < 1e-5 * ref.abs().max()
    exact = layer(x)
    rel = (q(x) - exact).norm() / exact.norm()
    assert rel < {3: 0.16, 4: 0.08, 6: 0.03, 8: 0.01}[bits], rel


def test_padding_for_shapes_off_the_kernel_tiles(isa):
    torch.manual_seed(0)
    layer = torch.nn.Linear(40, 25, bias=False)  # neither a multiple of 32 inputs nor of 16 outputs
    q = W4A8Linear(layer, bits=8)
    x = torch.randn(2, 3, 40)
    y = q(x)
    assert y.shape == (2, 3, 25)
    assert (y - layer(x)).norm() / layer(x).norm() < 0.01


def test_rows_do_not_depend_on_the_rest_of_the_batch(isa):
    """Bit for bit: a token verified beside drafts gets the logits it gets alone, so greedy speculation equals
    plain decoding. Rows of very different ranges would expose a scale shared across the batch."""
    torch.manual_seed(0)
    layer = torch.nn.Linear(256, 64, bias=True)
    for bits in (3, 4, 6, 8):
        q = W4A8Linear(layer, bits=bits)
        x = torch.randn(20, 256) * torch.logspace(-2, 2, 20)[:, None]
        together = q(x)
        for n in (1, 5, 9, 20):
            assert torch.equal(q(x[:n]), together[:n])
        alone = torch.cat([q(x[i : i + 1]) for i in range(20)])
        assert torch.equal(together, alone)


def test_activations_round_half_to_even_on_the_largest_magnitude(isa):
    """A row's int8 codes are nearbyint(x * 127 / max |x|): halves go to the even code, the largest magnitude
    (either sign) is +-127, NaN-free rows of zeros give zeros. Rows built so that x * 127 / max |x| lands on exact
    halves; a quantizer that rounded halves away from zero, truncated, or took max x instead of max |x| would
    move codes by one, which the float64 reference below sees (a code is worth ~1/15 of the output's scale)."""
    torch.manual_seed(1)
    layer = torch.nn.Linear(64, 32, bias=False)
    for bits in (3, 4, 6, 8):
        q = W4A8Linear(layer, bits=bits)
        halves = torch.arange(-31.5, 32.0, 1.0)  # 64 exact halves, |x| < 127
        x = torch.stack([torch.cat([torch.tensor([-127.0]), halves[1:]]),  # the largest magnitude is negative
                         torch.cat([halves[:-1], torch.tensor([127.0])]) * 0.25,  # a power-of-two scale: still exact
                         torch.zeros(64)])
        sx = x.abs().amax(-1, keepdim=True) / 127
        xq = torch.round(x / torch.where(sx > 0, sx, 1.0))  # torch.round: half to even
        assert (xq[:2] != torch.trunc(x[:2] / sx[:2])).any()  # the rows do hold halves
        ref = (xq.double() @ dequantized(layer, bits).double().T) * sx.double()
        size = (xq.double().abs() @ dequantized(layer, bits).double().abs().T) * sx.double()
        assert ((q(x).double() - ref).abs() <= 1e-5 * size.amax(-1, keepdim=True).clamp_min(1e-30)).all(), bits


def test_step_and_offset_codes_hold_each_group_within_half_a_unit():
    """unit_codes: 8-bit codes on a bf16 unit per 8 groups decode each group's step and offset to within half a
    unit, the largest to within 1/250 of itself; a step never decodes to 0; codes and units pack as the kernel
    reads them."""
    from verispec.models.quant import UNIT_GROUPS, unit_codes

    gen = torch.Generator().manual_seed(3)
    s = torch.rand(32, 20, generator=gen) * torch.logspace(-4, 0, 32)[:, None] + 1e-6
    s[:, 3] = 1e-9  # a step far below its unit's: code 1, not 0
    o = torch.randn(32, 20, generator=gen) * torch.logspace(-4, 0, 32)[:, None]
    step, offset, codes, units = unit_codes(s, o)
    assert codes.shape == (32, 20, 2) and codes.dtype == torch.uint8
    assert units.shape == (32, -(-20 // UNIT_GROUPS), 2) and units.dtype == torch.bfloat16
    su, ou = (units[..., i].float().repeat_interleave(UNIT_GROUPS, 1)[:, :20] for i in (0, 1))
    a, b = codes[..., 0].float(), codes[..., 1].view(torch.int8).float()
    assert torch.equal(step, a * su) and torch.equal(offset, b * ou)
    assert (a >= 1).all() and (b.abs() <= 127).all()
    keep = torch.ones(20, dtype=torch.bool)
    keep[3] = False
    assert ((step - s)[:, keep].abs() <= su[:, keep] / 2 * 1.001).all()
    assert ((offset - o).abs() <= ou / 2 * 1.001).all()
    for v, d in ((s, step), (o.abs(), offset.abs())):
        top = v.reshape(32, -1).amax(-1)
        assert ((d.amax(-1) - top).abs() <= top / 250).all()


def test_a_coarser_grid_is_kept_not_requantized():
    """GGUF Q4_K groups whose codes skip 0 or 15 (step s, offset o) come back exactly; a min/max grid would move
    every weight. Weights off any 4-bit grid are told apart."""
    torch.manual_seed(0)
    codes = torch.randint(2, 14, (64, 128)).float()
    codes[:, ::32] = 2
    codes[:, 1::32] = 13  # every group spans codes 2..13: 11 steps, not 15
    s = torch.rand(64, 4).repeat_interleave(32, dim=1) * 0.01 + 0.001
    o = torch.randn(64, 4).repeat_interleave(32, dim=1) * 0.01
    w = (codes * s + o).half().float()
    q, qs, qo = affine_groups(w, 15)
    back = (q.reshape(64, 4, 32).float() * qs.float()[..., None] + qo.float()[..., None]).reshape(64, 128)
    assert (back - w).abs().max() < 2e-3 * w.abs().max()
    assert on_4bit_grid(w)
    assert not on_4bit_grid(torch.randn(64, 128))


@pytest.mark.parametrize("kind", ["w4a8", "w4a8-4bit", "w4a8-3bit"])
def test_w4a8_target_speculative_equals_its_own_plain(isa, kind, tmp_path):
    """A w4a8 target is a model of its own; speculation reproduces its greedy output token for token, and the
    cached weights (8-bit and 4-bit matrices mixed) load back to the same model."""
    target_dir = make_tiny_hf_dir(tmp_path / "t", seed=0, std=1.5)
    draft_dir = make_tiny_hf_dir(tmp_path / "d", seed=1, noise_from=target_dir)
    first = load(str(target_dir), dtype=kind, progress=False)
    assert (target_dir / cache_file(kind)).is_file()
    again = load(str(target_dir), dtype=kind, progress=False)
    assert [m.bits for m in again.model.modules() if isinstance(m, W4A8Linear)] == \
        [m.bits for m in first.model.modules() if isinstance(m, W4A8Linear)]
    if kind == "w4a8-3bit":  # the MLP at 3 bits, the rest at 4, and so after a reload
        assert {name.rsplit(".", 1)[-1]: m.bits for name, m in again.model.named_modules()
                if isinstance(m, W4A8Linear)} == {"wqkv": 4, "wo": 4, "w13": 3, "w2": 3, "lm_head": 4}
    draft = load(str(draft_dir), dtype="w4a8-4bit", progress=False)
    params = GenerationParams(max_new_tokens=30, gamma=4)
    for prompt in ([1, 5, 9], [3, 3, 7, 2, 11]):
        plain = generate(first.model, prompt, params)
        assert generate(again.model, prompt, params).token_ids == plain.token_ids
        for gamma in (2, 4, 8):
            spec = generate(first.model, prompt, GenerationParams(max_new_tokens=30, gamma=gamma),
                            DraftModelProposer(draft.model, 64))
            assert spec.token_ids == plain.token_ids
        assert spec.metrics.accepted > 0



# ---- the CPU-feature matrix: every build against float64, row by row, and against each other -----------------
def _extreme_layer(bits: int, n: int = 48, k: int = 256) -> torch.nn.Linear:
    """Weights whose codes are mostly the top one (7, 15, 63 or 255) and activations that quantize to +-127: the largest
    sums of products an int16 pair can see (an unsigned x signed pair sum saturates there with 6- or 8-bit codes)."""
    layer = torch.nn.Linear(k, n, bias=False)
    with torch.no_grad():
        layer.weight.fill_(1.0)
        layer.weight[:, ::32] = 0.0  # each group spans 0..1: every other weight is the top code
        layer.weight[::3] *= -1  # and some columns are all-negative
    return layer


@pytest.mark.parametrize("bits", [3, 4, 6, 8])
def test_feature_matrix_each_build_against_float64(isa, bits):
    """Per build: the exact integer dot products (float64 of the same quantized operands, within float32
    accumulation of 8 groups) for random rows and for the sums that would saturate int16, and each row
    bit-identical whatever rows share its call (1..20 rows: every remainder of the builds' row blocks). 800 inputs
    are 25 groups: the last unit has one, and the last pair of groups its first alone."""
    torch.manual_seed(bits)
    for layer, x in ((torch.nn.Linear(256, 48, bias=True), torch.randn(20, 256) * torch.logspace(-3, 3, 20)[:, None]),
                     (torch.nn.Linear(800, 32, bias=True), torch.randn(20, 800) * torch.logspace(-3, 3, 20)[:, None]),
                     (_extreme_layer(bits), torch.sign(torch.randn(20, 256)) * torch.logspace(-3, 3, 20)[:, None])):
        q = W4A8Linear(layer, bits=bits)
        y = q(x)
        sx = x.abs().amax(-1, keepdim=True) / 127
        xq = torch.round(x * (1 / sx))
        w = dequantized(layer, bits).double()
        ref = (xq.double() @ w.T) * sx.double()
        # float32 accumulation errs relative to the products' magnitudes (a row of the extreme layer sums to 0)
        size = (xq.double().abs() @ w.abs().T) * sx.double()
        if layer.bias is not None:
            ref += layer.bias.double()
        assert ((y.double() - ref).abs() <= 1e-5 * size.amax(-1, keepdim=True)).all()
        for rows in range(1, 21):
            assert torch.equal(q(x[:rows]), y[:rows]), rows
        assert torch.equal(torch.cat([q(x[i : i + 1]) for i in range(20)]), y)


@pytest.mark.parametrize("bits", [3, 4, 6, 8])
def test_builds_are_bit_identical(bits):
    """Integer dot products are exact and both builds run the same float epilogue in the same order, so a model
    gives the same bits on an AVX2 machine as on an AVX-512 one (here both builds run on one CPU)."""
    builds = {isa: _build_or_skip(isa) for isa in kernels.ISAS}
    gen = torch.Generator().manual_seed(bits)
    for n, k in ((80, 640), (48, 256)):
        layer = torch.nn.Linear(k, n, bias=True)
        q = W4A8Linear(layer if n == 80 else _extreme_layer(bits, n, k), bits=bits)
        bias = q.bias if q.bias is not None else torch.empty(0)
        for rows in range(1, 21):
            x = torch.randn(rows, k, generator=gen) * torch.logspace(-2, 2, rows)[:, None]
            ys = [b.w4a8_mm(x, q.weight, q.codes, q.units, bias) for b in builds.values()]
            assert all(torch.equal(y, ys[0]) for y in ys[1:]), (n, rows)


def test_sampling_kernels_are_bit_identical_across_builds():
    """sample.cpp runs the same 8-lane code in every build: a sampled run's probabilities and draws do not depend on
    whether the CPU has AVX-512 (here every build runs on one CPU)."""
    builds = {isa: _build_or_skip(isa) for isa in kernels.ISAS}
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(3, 151936, generator=gen) * 5
    x[1, ::7] = float("-inf")
    u = torch.rand(3, dtype=torch.float64, generator=gen)
    probs = [b.softmax_t(x, 0.7) for b in builds.values()]
    assert all(torch.equal(p, probs[0]) for p in probs[1:])
    ids = [b.sample_rows(probs[0], u, 1187) for b in builds.values()]
    assert all(torch.equal(i, ids[0]) for i in ids[1:])
    draft, ua = torch.tensor([3, 9]), torch.rand(2, generator=gen)
    for q in (probs[0][:2] * 0.5, torch.empty(0)):  # a chain's verification: the same outcome in every build
        rounds = [b.verify_row(x, 0.7, draft, q, ua, u[:1], 1187) for b in builds.values()]
        assert all(torch.equal(r, rounds[0]) for r in rounds[1:])


def test_a_built_kernel_is_imported_as_it_is_by_any_checkout_or_environment(monkeypatch, tmp_path):
    """ninja's build file names its sources' and the environment's paths: asked to load, a second checkout or virtual
    environment of the same code (CI's clone beside a working tree) would rebuild the cached kernel at its first
    forward. Built once, it is imported without the builder."""
    from torch.utils import cpp_extension

    calls: list[dict] = []
    monkeypatch.setenv("VERISPEC_CACHE", str(tmp_path))
    monkeypatch.setattr(cpp_extension, "load", lambda **kw: calls.append(kw) or kw["build_directory"])
    build = Path(kernels._build.__wrapped__("avx2"))
    name = f"verispec_w4a8_avx2_{build.name.rsplit('-', 1)[1]}"  # the folder is w4a8-avx2-<key>
    assert build.parent == tmp_path / "kernels" and len(calls) == 1 and calls[0]["name"] == name
    here = Path(kernels.__file__).parent
    assert calls[0]["sources"] == [str(here / source) for source in kernels.SOURCES]
    (build / f"{name}.so").write_bytes(b"")
    imported: list[Path] = []
    monkeypatch.setattr(kernels, "_import_built", lambda n, path: imported.append(path) or "module")
    assert kernels._build.__wrapped__("avx2") == "module"
    assert imported == [build / f"{name}.so"] and len(calls) == 1
    monkeypatch.setattr(kernels, "_import_built", lambda n, path: (_ for _ in ()).throw(ImportError("truncated")))
    kernels._build.__wrapped__("avx2")  # a broken file is built again
    assert len(calls) == 2 and calls[1]["name"] == name


def test_build_is_picked_from_the_cpu_and_can_be_forced(monkeypatch):
    """The best build this CPU runs, unless $VERISPEC_KERNEL_ISA names one; a build the CPU lacks is refused with
    the missing flags, a CPU with AVX-VNNI and no AVX-512 gets the AVX-VNNI build (faked flags: an Alder Lake's),
    one with AVX-512 VNNI and no AVX-VNNI runs it as its EVEX stand-in (a Zen 4's), and a CPU without either gets
    the AVX2 build (a Zen 3's)."""
    for isa in ("avx2", "avxvnni"):  # an AVX2 or AVX-VNNI machine compiles no AVX-512 code
        assert not any("avx512" in f for f in kernels.ISA_CFLAGS[isa])
    monkeypatch.delenv(kernels.ISA_ENV, raising=False)
    assert kernels.kernel_isa() == kernels.available_isas()[0]
    monkeypatch.setenv(kernels.ISA_ENV, "avx3")
    with pytest.raises(KernelError, match="avx512, avxvnni, avx2"):
        kernels.kernel_isa()
    alder_lake = frozenset({"sse4_2", "avx", "avx2", "fma", "f16c", "bmi2", "avx_vnni"})
    monkeypatch.setattr(kernels, "cpu_flags", lambda: alder_lake)
    monkeypatch.setenv(kernels.ISA_ENV, "auto")
    assert kernels.available_isas() == ["avxvnni", "avx2"] and kernels.kernel_isa() == "avxvnni"
    assert "-mavxvnni" in kernels.isa_cflags("avxvnni") and not any("avx512" in f for f in kernels.isa_cflags("avxvnni"))
    zen4 = frozenset({"avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx512_bf16"})
    monkeypatch.setattr(kernels, "cpu_flags", lambda: zen4)
    assert kernels.available_isas() == ["avx512", "avxvnni", "avx2"]
    assert "-DVERISPEC_YMM" in kernels.isa_cflags("avxvnni") and "-mavxvnni" not in kernels.isa_cflags("avxvnni")
    zen3 = frozenset({"sse4_2", "avx", "avx2", "fma", "f16c", "bmi2"})
    monkeypatch.setattr(kernels, "cpu_flags", lambda: zen3)
    monkeypatch.setenv(kernels.ISA_ENV, "avx512")
    with pytest.raises(KernelError, match="avx512_vnni"):
        kernels.kernel_isa()
    with pytest.raises(KernelError, match="avx512_vnni"):
        w4a8("avx512")
    monkeypatch.setenv(kernels.ISA_ENV, "auto")
    assert kernels.available_isas() == ["avx2"] and kernels.kernel_isa() == "avx2"


@pytest.mark.slow
def test_the_avx_vnni_build_compiles_to_vex_vpdpbusd(tmp_path):
    """The build an AVX-VNNI CPU (Intel since Alder Lake) runs, compiled here whatever this CPU is (not run: the
    tests above run its EVEX stand-in where the CPU has AVX-512 VNNI): 256-bit VEX vpdpbusd, no AVX-512 code."""
    import shutil
    import subprocess
    from pathlib import Path

    from torch.utils import cpp_extension

    here = Path(kernels.__file__).parent
    try:
        module = cpp_extension.load(name="verispec_w4a8_vex_check", sources=[str(here / n) for n in kernels.SOURCES],
                                    extra_cflags=kernels.ISA_CFLAGS["avxvnni"], extra_ldflags=kernels.LDFLAGS,
                                    build_directory=str(tmp_path))
    except (RuntimeError, OSError) as e:
        pytest.skip(f"this compiler cannot build for AVX-VNNI (GCC < 11?): {str(e)[:200]}")
    assert module.isa() == "avxvnni"
    if shutil.which("objdump") is None:
        pytest.skip("no objdump to read the build's instructions")
    code = subprocess.run(["objdump", "-d", str(next(tmp_path.glob("*.so")))], capture_output=True, text=True).stdout
    assert "{vex} vpdpbusd" in code and "%zmm" not in code and "vpmaddubsw" not in code


def test_a_build_the_compiler_cannot_make_falls_back_to_the_next(monkeypatch, capsys):
    """A compiler without -mavxvnni (GCC < 11) on an AVX-VNNI CPU: the AVX2 build runs, kernel_isa() says so and
    one line says why; forced with $VERISPEC_KERNEL_ISA, the failure is the error."""
    built: list[str] = []

    def build(isa: str):
        built.append(isa)
        if isa == "avxvnni":
            raise KernelError("cannot build the w4a8 kernel (g++: error: unrecognized command-line option '-mavxvnni')")
        return isa

    monkeypatch.setattr(kernels, "cpu_flags", lambda: frozenset({"avx", "avx2", "fma", "f16c", "avx_vnni"}))
    monkeypatch.setattr(kernels, "_build", build)
    monkeypatch.setattr(kernels, "_chosen", {})
    monkeypatch.setattr(kernels, "_unbuildable", set())
    monkeypatch.delenv(kernels.ISA_ENV, raising=False)
    assert w4a8() == "avx2" and built == ["avxvnni", "avx2"] and kernels.kernel_isa() == "avx2"
    assert "the avxvnni kernel build failed" in capsys.readouterr().err
    monkeypatch.setenv(kernels.ISA_ENV, "avxvnni")
    with pytest.raises(KernelError, match="mavxvnni"):
        w4a8()


def test_refusals_name_what_to_use(tmp_path, monkeypatch):
    """A CPU with AVX2 loads w4a8 (on the AVX2 build) where w8a8 is refused; one with neither gets one line that
    recommends what runs there, not w8a8."""
    path = make_tiny_hf_dir(tmp_path / "m", seed=0)
    monkeypatch.delenv(kernels.ISA_ENV, raising=False)
    if "avx2" in kernels.available_isas():
        _build_or_skip("avx2")
        monkeypatch.setattr(kernels, "cpu_flags", lambda: frozenset({"avx", "avx2", "fma", "f16c"}))
        assert kernels.kernel_isa() == "avx2"
        assert any(isinstance(m, W4A8Linear) for m in load(str(path), dtype="w4a8-4bit", progress=False).model.modules())
    monkeypatch.setattr(kernels, "cpu_flags", lambda: frozenset({"sse4_2", "avx"}))
    with pytest.raises(ModelError) as refused:
        load(str(path), dtype="w4a8", progress=False)
    message = str(refused.value)
    assert "AVX2" in message and "w8a8" not in message and "\n" not in message


def test_read_safetensors_matches_the_library_and_aligns(tmp_path):
    """verispec's plain-read loader (no mapping: a quantized model's load no longer peaks at twice its size) gives
    the tensors safetensors itself reads, every one in its own 64-byte-aligned allocation."""
    from safetensors.torch import load_file, save_file

    from verispec.models.files import read_safetensors

    state = {"f32": torch.randn(3, 5), "bf16": torch.randn(7).bfloat16(), "u8": torch.randint(0, 255, (4, 9), dtype=torch.uint8),
             "f16": torch.randn(2, 2).half(), "i64": torch.arange(5), "empty": torch.empty(0, 4)}
    save_file(state, str(tmp_path / "x.safetensors"))
    ours, theirs = read_safetensors(tmp_path / "x.safetensors"), load_file(str(tmp_path / "x.safetensors"))
    assert ours.keys() == theirs.keys()
    for k in ours:
        assert ours[k].dtype == theirs[k].dtype and torch.equal(ours[k], theirs[k]), k
        assert ours[k].numel() == 0 or ours[k].data_ptr() % 64 == 0, k


def test_embedding_kept_in_bf16_only_where_lossless(tiny_target):
    """A float32 model whose table holds bf16 values keeps it in bf16 and computes the same logits; a table with
    values bf16 cannot hold stays float32."""
    import copy

    from verispec.models.quant import compact_embedding

    model = copy.deepcopy(tiny_target).float()
    tokens = torch.tensor([[1, 5, 9, 2]]) % model.vocab_size
    assert not compact_embedding(model) and model.embed.weight.dtype == torch.float32  # random float32 values
    with torch.no_grad():
        model.embed.weight.copy_(model.embed.weight.bfloat16().float())
    before = model.forward(tokens, model.new_cache(8))
    assert compact_embedding(model) and model.embed.weight.dtype == torch.bfloat16
    assert model.dtype == torch.float32
    assert torch.equal(model.forward(tokens, model.new_cache(8)), before)


def test_weight_bytes_per_token_counts_every_w4a8_operand(tiny_target):
    """The bandwidth limit's byte count: a w4a8 model's packed weights, step/offset codes, units (and biases), the norms, and
    one row of the embedding table (offsets were once left out: the limit came out 9% low for the 1.5B target)."""
    import copy

    from verispec.models.base import weight_bytes_per_token
    from verispec.models.quant import quantize

    model = quantize(copy.deepcopy(tiny_target).float(), "w4a8")
    linears = [m for m in model.modules() if isinstance(m, W4A8Linear)]
    expected = sum(b.numel() * b.element_size() for m in linears for b in m.buffers())
    expected += sum(p.numel() * p.element_size() for n, p in model.named_parameters() if not n.startswith("embed"))
    expected += model.embed.weight.shape[1] * model.embed.weight.element_size()
    assert weight_bytes_per_token(model) == expected


def test_the_draft_window_default_follows_the_kernel_build(isa, tmp_path):
    """Beside a w4a8 target the draft reads a prompt's last 64 tokens with the 256-bit builds (their slower prefill
    makes the draft's own prefill dear) and 256 with the AVX-512 one; a non-w4a8 target and --draft-context keep
    theirs."""
    from verispec.defaults import AVX2_DRAFT_CONTEXT, DEFAULT_DRAFT_CONTEXT
    from verispec.strategies import StrategyOptions, make_proposer

    target_dir = make_tiny_hf_dir(tmp_path / "t", seed=0)
    draft_dir = make_tiny_hf_dir(tmp_path / "d", seed=1, noise_from=target_dir)
    target, draft = load(str(target_dir), dtype="w4a8", progress=False), load(str(draft_dir), progress=False)
    plain = load(str(target_dir), progress=False)

    def window(t, options: StrategyOptions = StrategyOptions()) -> int | None:
        proposer = make_proposer("auto", t, draft, 64, options)
        while not isinstance(proposer, DraftModelProposer):
            proposer = proposer.draft
        return proposer.context

    assert AVX2_DRAFT_CONTEXT != DEFAULT_DRAFT_CONTEXT
    assert window(target) == (DEFAULT_DRAFT_CONTEXT if isa == "avx512" else AVX2_DRAFT_CONTEXT)
    assert window(plain) == DEFAULT_DRAFT_CONTEXT
    assert window(target, StrategyOptions(draft_context=9)) == 9
    assert window(target, StrategyOptions(draft_context=0)) is None
