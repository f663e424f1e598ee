"""An adapter that runs any transformers causal LM behind the CausalLM protocol.

The native Llama-family model is faster and is what verispec uses for Qwen2/Llama; this adapter covers
every other architecture (e.g. Gemma 3) and serves as a numerical reference. transformers' DynamicCache
grows as it is written, so "commit" is bookkeeping and the uncommitted tail is cropped before the next
forward — the same contract as verispec.cache.KVCache.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import Tensor

from verispec.cache import CacheFullError, CommitLog


class HFCache(CommitLog):
    def __init__(self, max_len: int) -> None:
        from transformers import DynamicCache

        self.inner = DynamicCache()
        self.max_len = max_len
        self.length = 0

    def reset(self) -> None:
        self.__init__(self.max_len)


class HFCausalLM:
    """Implements verispec.models.base.CausalLM over a transformers AutoModelForCausalLM."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model.eval()
        self.vocab_size = model.get_output_embeddings().weight.shape[0]

    @classmethod
    def from_dir(cls, path: str | Path, *, dtype: torch.dtype = torch.bfloat16, device: str = "cpu") -> "HFCausalLM":
        from transformers import AutoModelForCausalLM

        return cls(AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype).to(device))

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @property
    def dtype(self) -> torch.dtype:
        return next(self.model.parameters()).dtype

    def new_cache(self, max_len: int, batch: int = 1) -> HFCache:
        return HFCache(max_len)

    @torch.inference_mode()
    def forward(self, tokens: Tensor, cache: HFCache, *, last_n: int | None = None) -> Tensor:
        extra = cache.inner.get_seq_length() - cache.length
        if extra > 0:
            cache.inner.crop(-extra)  # transformers 5: a negative count removes that many tokens
        t = tokens.shape[1]
        if cache.length + t > cache.max_len:
            raise CacheFullError(f"sequence of {cache.length + t} tokens exceeds the cache size of {cache.max_len}")
        positions = torch.arange(cache.length, cache.length + t, device=tokens.device)[None]
        out = self.model(
            input_ids=tokens, past_key_values=cache.inner, position_ids=positions, cache_position=positions[0],
            use_cache=True, logits_to_keep=last_n or 0,
        )
        return out.logits
