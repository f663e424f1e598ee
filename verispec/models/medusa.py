"""Medusa heads (Cai et al. 2024): small heads on the target's last feature, head k guessing the token k+2 ahead.

The target's feature h_t (its last block's output at position t, before the final norm) is what its LM head reads
to predict token t+1. Head k (k = 0 .. K-1) reads the same h_t and guesses token t+2+k:

    z   = norm(h_t)                   the target's final norm (shared, not copied)
    z_k = z + SiLU(W_k z + b_k)       one residual block per head (Medusa-1)
    q_k = softmax(head(z_k))          one head for all K: the first `head_vocab` rows of the target's LM head

so a round's K guesses cost K small matmuls and one pass over a small head, with no cache and no sequential steps.
The guesses do not see each other (head 1 does not know what head 0 guessed): cheaper than EAGLE, less accurate
deep in a chain. A heads directory holds config.json (`MedusaConfig`) and model.safetensors (blocks and head rows).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from verispec.models.files import DRAFTER_CONFIG, DRAFTER_WEIGHTS
from verispec.models.llama import LlamaModel


@dataclass(frozen=True)
class MedusaConfig:
    kind: str  # "medusa"
    target: str  # the target it was trained for (its name), for the record; load checks the hidden size
    hidden_size: int
    heads: int  # K: the longest chain a round can draft
    head_vocab: int  # rows of the target's LM head the heads propose from

    @classmethod
    def for_target(cls, target: LlamaModel, name: str, *, heads: int = 4, head_vocab: int = 32000) -> "MedusaConfig":
        return cls("medusa", name, target.cfg.hidden_size, heads, min(head_vocab, target.cfg.vocab_size))


class MedusaHeads(nn.Module):
    """K residual blocks and one shared head over the target's normed feature (see the module docstring)."""

    def __init__(self, cfg: MedusaConfig) -> None:
        super().__init__()
        h = cfg.hidden_size
        self.medusa = cfg
        self.blocks = nn.ModuleList(nn.Linear(h, h) for _ in range(cfg.heads))
        self.lm_head = nn.Linear(h, cfg.head_vocab, bias=False)
        self.norm: nn.Module | None = None  # the target's, from share()

    @classmethod
    def fresh(cls, cfg: MedusaConfig, target: LlamaModel, head: Tensor) -> "MedusaHeads":
        """Heads to train, on the target's device: every block starts as the identity (zero weights), so each head
        starts by guessing what the target's own head would (token t+1, a poor but harmless guess for t+2+k);
        `head` [head_vocab, H]."""
        with torch.device("meta"):
            heads = cls(cfg)
        h = cfg.hidden_size
        state = {"lm_head.weight": head.detach().float().clone()}
        for k in range(cfg.heads):
            state[f"blocks.{k}.weight"], state[f"blocks.{k}.bias"] = torch.zeros(h, h), torch.zeros(h)
        heads.load_state_dict(state, strict=True, assign=True)
        return heads.to(target.device).share(target)  # beside the target (a GPU's)

    def share(self, target: LlamaModel) -> "MedusaHeads":
        """Use the target's final norm (never trained here, never copied)."""
        if target.cfg.hidden_size != self.medusa.hidden_size:
            raise ValueError(f"heads for hidden size {self.medusa.hidden_size}, target has {target.cfg.hidden_size}")
        self.norm = target.norm
        return self

    def forward(self, features: Tensor) -> Tensor:
        """features [..., H] (the target's h_t) -> logits [..., K, head_vocab]: head k's guess at token t+2+k."""
        assert self.norm is not None, "MedusaHeads.share(target) first"
        z = self.norm(features.to(self.norm.weight.dtype)).to(self.blocks[0].weight.dtype)
        return self.lm_head(torch.stack([z + F.silu(block(z)) for block in self.blocks], dim=-2))

    def own_state(self) -> dict[str, Tensor]:
        """The heads' own weights (blocks, head rows): what a heads directory stores."""
        return {k: v for k, v in self.state_dict().items() if not k.startswith("norm.")}

    def save(self, directory: Path) -> None:
        from verispec.models.files import save_drafter

        save_drafter(directory, self.own_state(), asdict(self.medusa))


def load_heads(directory: str | Path, target: LlamaModel, *, quantize_kind: str | None = None) -> MedusaHeads:
    """A heads directory over `target` (its final norm shared). quantize_kind: e.g. "w4a8-4bit" to run the shared
    head on the target's kernel (the blocks stay float: they are small; heads change acceptance, never output)."""
    from verispec.models.errors import ModelError
    from verispec.models.files import drafter_config, read_safetensors

    directory = Path(directory).expanduser()
    try:
        cfg = MedusaConfig(**drafter_config(directory, "medusa", "a Medusa heads"))
    except TypeError as e:
        raise ModelError(f"{directory} is not a Medusa heads directory ({DRAFTER_CONFIG}: {e})") from None
    with torch.device("meta"):
        heads = MedusaHeads(cfg)
    try:
        heads.load_state_dict(read_safetensors(directory / DRAFTER_WEIGHTS), strict=True, assign=True)
    except (OSError, RuntimeError) as e:
        raise ModelError(f"{directory / DRAFTER_WEIGHTS} does not fit these heads: {e}") from None
    heads = heads.float().eval()
    heads.requires_grad_(False)
    if quantize_kind is not None:
        from verispec.models.quant import quantize

        heads.lm_head = quantize(nn.ModuleList([heads.lm_head]), quantize_kind)[0]
    try:
        return heads.to(target.device).share(target)  # on the target's device (a GPU's)
    except ValueError as e:
        raise ModelError(f"{directory}: {e}") from None
