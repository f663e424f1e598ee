"""verispec's 4-bit-weight x int8-activation CPU kernel (verispec/models/kernels/w4a8.cpp)."""

from __future__ import annotations

import pytest
import torch

from tests.tiny_hf import make_tiny_hf_dir
from verispec.engine import GenerationParams, generate
from verispec.models.kernels import KernelError, w4a8
from verispec.models.load import load
from verispec.models.quant import W4A8Linear, affine_groups, cache_file, on_4bit_grid
from verispec.proposers.draft_model import DraftModelProposer

try:
    w4a8()
except KernelError as e:  # no AVX-512 VNNI, or no compiler: the dtype refuses with this message
    pytest.skip(f"w4a8 kernel unavailable: {e}", allow_module_level=True)


def dequantized(layer: torch.nn.Linear, bits: int) -> torch.Tensor:
    w = layer.weight.detach().float()
    q, s, o = affine_groups(w, 2**bits - 1)
    n, k = w.shape
    return (q.reshape(n, k // 32, 32).float() * s.float()[..., None] + o.float()[..., None]).reshape(n, k)


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("rows", [1, 3, 8, 9, 17])
def test_kernel_matches_its_dequantized_weights_and_quantized_rows(bits, rows):
    """Against a float64 reference with the same quantization (weights per group, activations per row): the only
    difference left is float32 accumulation order."""
    torch.manual_seed(rows)
    layer = torch.nn.Linear(192, 80, bias=True)
    q = W4A8Linear(layer, bits=bits)
    x = torch.randn(rows, 192) * 3
    sx = x.abs().amax(-1, keepdim=True) / 127
    xq = torch.round(x * (1 / sx))
    ref = (xq.double() @ dequantized(layer, bits).double().T) * sx.double() + layer.bias.double()
    assert (q(x).double() - ref).abs().max() < 1e-5 * ref.abs().max()
    exact = layer(x)
    rel = (q(x) - exact).norm() / exact.norm()
    assert rel < (0.08 if bits == 4 else 0.01), rel


def test_padding_for_shapes_off_the_kernel_tiles():
    torch.manual_seed(0)
    layer = torch.nn.Linear(40, 25, bias=False)  # neither a multiple of 32 inputs nor of 16 outputs
    q = W4A8Linear(layer, bits=8)
    x = torch.randn(2, 3, 40)
    y = q(x)
    assert y.shape == (2, 3, 25)
    assert (y - layer(x)).norm() / layer(x).norm() < 0.01


def test_rows_do_not_depend_on_the_rest_of_the_batch():
    """Bit for bit: a token verified beside drafts gets the logits it gets alone, so greedy speculation equals
    plain decoding. Rows of very different ranges would expose a scale shared across the batch."""
    torch.manual_seed(0)
    layer = torch.nn.Linear(256, 64, bias=True)
    for bits in (4, 8):
        q = W4A8Linear(layer, bits=bits)
        x = torch.randn(20, 256) * torch.logspace(-2, 2, 20)[:, None]
        together = q(x)
        for n in (1, 5, 9, 20):
            assert torch.equal(q(x[:n]), together[:n])
        alone = torch.cat([q(x[i : i + 1]) for i in range(20)])
        assert torch.equal(together, alone)


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


@pytest.mark.parametrize("kind", ["w4a8", "w4a8-4bit"])
def test_w4a8_target_speculative_equals_its_own_plain(kind, tmp_path):
    """A w4a8 target is a model of its own; speculation reproduces its greedy output token for token, and the
    cached weights (8-bit and 4-bit matrices mixed) load back to the same model."""
    target_dir = make_tiny_hf_dir(tmp_path / "t", seed=0, std=1.5)
    draft_dir = make_tiny_hf_dir(tmp_path / "d", seed=1, noise_from=target_dir)
    first = load(str(target_dir), dtype=kind, progress=False)
    assert (target_dir / cache_file(kind)).is_file()
    again = load(str(target_dir), dtype=kind, progress=False)
    assert [m.bits for m in again.model.modules() if isinstance(m, W4A8Linear)] == \
        [m.bits for m in first.model.modules() if isinstance(m, W4A8Linear)]
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

