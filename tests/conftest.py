"""Shared fixtures and helpers: tiny random Llama-family models (float32, CPU) for the losslessness suite."""

from __future__ import annotations

import os

import pytest
import torch

from verispec.models.llama import LlamaConfig, LlamaModel


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "slow: long-running tests (full grids, real models); run with -m slow")


# The whole suite runs on a 2-core machine: a tiny model is dominated by per-op overhead, which extra intra-op
# threads only make worse (and they fight with other processes for the two cores). The README's command runs one
# pytest-xdist worker per core instead (-n auto): 150 s against 270 s in one process.
torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _one_thread_after_each_test():
    """The CLI's commands set torch to every core (models.load.default_threads); put it back for the next test."""
    yield
    torch.set_num_threads(1)


# Without a GPU, a Triton kernel (verispec.models.triton_attention) can only run in Triton's interpreter, on CPU
# tensors; it must be chosen before Triton is first imported, which some torch paths do on their own.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


def triton_on_cpu() -> None:
    """Run Triton kernels with Triton's interpreter on CPU tensors, or skip: where Triton is missing (CPU builds of
    torch come without it; the test extra installs it) or where a GPU would run them for real."""
    if torch.cuda.is_available():
        pytest.skip("a GPU runs the Triton kernels for real: benchmarks/cuda_check.py checks them there")
    pytest.importorskip("triton", reason="Triton is not installed (pip install -e '.[test]' installs it)")
    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("TRITON_INTERPRET is set to something else than 1")


def tiny_config(vocab_size: int = 6, *, hidden: int = 32, layers: int = 2, heads: int = 4, kv_heads: int = 2,
                max_pos: int = 128, bias: bool = False) -> LlamaConfig:
    """A 2-layer GQA Llama config (4 query heads share 2 KV heads, head_dim 8)."""
    return LlamaConfig(
        vocab_size=vocab_size, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
        num_attention_heads=heads, num_key_value_heads=kv_heads, max_position_embeddings=max_pos,
        attention_bias=bias,
    )


def noisy_copy(model: LlamaModel, noise: float, seed: int) -> LlamaModel:
    """A draft model: the same architecture with the target's weights plus N(0, noise^2 * std(w)^2) noise.

    The noise is relative to each tensor's spread, so norms (~1) and projections (~std) are perturbed alike.
    """
    gen = torch.Generator().manual_seed(seed)
    draft = LlamaModel(model.cfg)
    state = {}
    for name, w in model.state_dict().items():
        scale = w.float().std().item() if w.numel() > 1 else 1.0
        if name.endswith("norm.weight"):
            scale = 0.1  # norms are ~1 + 0.1 * N(0, 1)
        state[name] = w + noise * scale * torch.randn(w.shape, generator=gen, dtype=w.dtype)
    draft.load_state_dict(state)
    return draft.to(model.dtype).eval()


def fresh_logits(model: LlamaModel, tokens: list[int]) -> torch.Tensor:
    """Logits [len(tokens), V] of one prefill on an empty cache: the reference for every cache test."""
    cache = model.new_cache(len(tokens) + 1)
    return model.forward(torch.tensor([tokens], dtype=torch.long), cache)[0]


@pytest.fixture(scope="session")
def tiny_cfg() -> LlamaConfig:
    return tiny_config(vocab_size=6)


@pytest.fixture(scope="session")
def tiny_target(tiny_cfg: LlamaConfig) -> LlamaModel:
    """Vocab 6; std 0.4 gives peaky but non-degenerate next-token distributions (top token ~0.4-0.9)."""
    return LlamaModel.random(tiny_cfg, seed=3, std=0.4)


@pytest.fixture(scope="session")
def tiny_draft(tiny_target: LlamaModel) -> LlamaModel:
    """The target with noisy weights: alpha roughly 0.45-0.85 (prompt [4, 4, 1], gamma 1-5, T 0.7-1)."""
    return noisy_copy(tiny_target, noise=0.2, seed=7)


@pytest.fixture(scope="session")
def wide_cfg() -> LlamaConfig:
    """Vocab 32 for the greedy / cache tests, where longer, more varied texts are wanted."""
    return tiny_config(vocab_size=32, max_pos=256)


@pytest.fixture(scope="session")
def wide_target(wide_cfg: LlamaConfig) -> LlamaModel:
    return LlamaModel.random(wide_cfg, seed=11, std=0.5)


@pytest.fixture(scope="session")
def wide_draft(wide_target: LlamaModel) -> LlamaModel:
    """Greedy alpha ~0.65 at gamma 1 down to ~0.3 at gamma 7: rejections at every position happen."""
    return noisy_copy(wide_target, noise=0.04, seed=12)
