"""Self-speculation (Draft & Verify, LayerSkip): draft with the target's own first ℓ layers.

The draft model q is the target p cut short: its first ℓ blocks, then the target's final norm and LM head
(`model.forward(..., layers=ℓ)`). No second set of weights, no training, and no second KV cache: the proposer
drafts *in the target's own cache*.

Why sharing the cache is exact, with no catch-up and no separate prefill:
  * Block i's keys and values depend only on the outputs of blocks < i. So for any text, the first ℓ layers of
    the full model's KV cache are exactly the KV cache of the ℓ-layer draft model on the same text.
  * Engine invariant: between rounds the target cache holds every token of the sequence except `pending`, in
    all layers (the prompt prefill and every verification forward run all layers). Hence its layers < ℓ are
    a correct draft cache for the same text.
  * propose() feeds pending, d1, .., d(γ-1) one at a time with layers=ℓ at slots beyond cache.length,
    committing provisionally so each step sees the previous ones, then rolls back to the original length.
    Layers >= ℓ of those slots are left untouched (stale scratch).
  * The engine's verification forward then writes [pending, d1 .. dγ] at the same slots for *all* layers and
    commits pending + the accepted drafts. Every committed slot was therefore written by a full forward of the
    committed text, exactly as in plain decoding, and the invariant holds again for the next round.
Nothing the proposer writes can outlive its round, so it can change speed, never the output: verification is
the ordinary chain rule against p.

`verispec.calibrate.calibrate` picks ℓ per model by measuring greedy tokens/s through the engine; the choice is saved as JSON
under the cache dir and used when no ℓ is given (else half the layers).

Expect little from a model never trained for early exit (LayerSkip trains for it; Draft & Verify skips middle
layers instead of cutting the top ones): on Qwen2.5-Coder-1.5B the first ℓ of 28 layers agree with the full
model's greedy token on ~0% of code tokens up to ℓ = 8, ~5% at 14, ~80% at 24, where a draft step already costs
~0.85 of a target step (the LM head over 152k tokens is paid at every depth).
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import torch

from verispec.batch import Rows
from verispec.models.llama import LlamaModel
from verispec.proposers.base import Outcome, Proposal, ProposerStats
from verispec.proposers.draft_model import draft_steps
from verispec.sampling import SamplingParams


class LayerSkipProposer:
    """q = the target's first `layers` blocks + final norm + LM head, drafting in the target's KV cache rows
    (handed over by reset), with the draft loop every draft model uses (draft_model.draft_steps)."""

    def __init__(self, model: LlamaModel, layers: int) -> None:
        if not isinstance(model, LlamaModel):
            raise ValueError(
                f"layer-skip self-speculation needs the native Llama-family model (it runs a layer range), "
                f"not {type(model).__name__}"
            )
        n = model.cfg.num_hidden_layers
        if not 1 <= layers <= n:
            raise ValueError(f"layer-skip layers must be in 1..{n} for this model, got {layers}")
        self.model, self.layers = model, layers
        self.vocab_size = model.vocab_size
        self.target: Rows | None = None
        self.pending: dict[int, int] = {}
        self._stats: dict[int, ProposerStats] = {}

    def reset(self, rows: list[int], prompts: list[list[int]], target: Rows | None = None,
              hidden: list[torch.Tensor | None] | None = None) -> None:
        if target is None or target.model is not self.model:
            raise ValueError("layer-skip drafts in the target's own cache: reset it with the target's rows")
        for row, prompt in zip(rows, prompts):
            assert target.length(row) == len(prompt) - 1, "the target cache must hold the prompt but its last token"
        self.target = target
        for row, prompt in zip(rows, prompts):
            self.pending[row] = prompt[-1]
            self._stats[row] = ProposerStats()

    def propose(self, rows: list[int], gammas: list[int], sampling: list[SamplingParams],
                generators: list[torch.Generator], shapes: list[Shaper | None] | None = None) -> list[Proposal]:
        target = self.target
        # the verification forward needs gamma + 1 slots and commits at most gamma + 1 of them
        gammas = [min(g, target.max_len - target.length(r) - 1) for r, g in zip(rows, gammas)]
        return draft_steps(target, rows, [[self.pending[r]] for r in rows], gammas, sampling, generators,
                           self._stats, vocab_size=self.vocab_size, layers=self.layers, shapes=shapes).proposals

    def observe(self, row: int, outcome: Outcome) -> None:
        # Nothing to undo or catch up: the verification forward rewrote every slot the target committed.
        self.pending[row] = outcome.emitted[-1]

    def move(self, src: int, dst: int) -> None:
        for state in (self.pending, self._stats):
            state[dst] = state.pop(src)

    def free(self, row: int) -> None:
        for state in (self.pending, self._stats):
            state.pop(row, None)

    def stats(self, row: int) -> ProposerStats:
        return self._stats[row]


# ---- calibration: which ℓ is fastest for this model on this machine ------------------------------------------
def default_candidates(num_layers: int) -> list[int]:
    """A handful of depths between 1/8 and 3/4 of the model, e.g. 28 layers -> [4, 7, 10, 14, 18, 21]."""
    depths = {max(1, round(num_layers * f)) for f in (1 / 8, 1 / 4, 3 / 8, 1 / 2, 5 / 8, 3 / 4)}
    return sorted(d for d in depths if d < num_layers) or [1]


CALIBRATION_FILE = "layerskip-calibration.json"


def calibration_path() -> Path:
    from verispec.models.packaged import cache_dir

    return cache_dir() / CALIBRATION_FILE


def model_id(target: Any) -> str:
    """The key a calibration is saved under: the resolved directory of the loaded model."""
    return str(Path(target.path).expanduser().resolve())


def _read(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as e:
        warnings.warn(f"ignoring unreadable layer-skip calibration {path}: {e}", stacklevel=3)
        return {}
    return data if isinstance(data, dict) else {}


def save_calibration(path: Path | None, model_id: str, result: dict) -> Path:
    """Store `result` under `model_id` in the JSON file at `path` (None: `calibration_path()`), keeping the
    other models' entries. Returns the file written."""
    path = Path(path) if path is not None else calibration_path()
    data = _read(path)
    data[model_id] = result
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
    tmp.replace(path)  # atomic: a crash mid-write never leaves half a file
    return path


def load_calibration(path: Path | None, model_id: str) -> dict | None:
    """The saved calibration of `model_id`, or None when there is none (or the file is unreadable)."""
    entry = _read(Path(path) if path is not None else calibration_path()).get(model_id)
    return entry if isinstance(entry, dict) else None
