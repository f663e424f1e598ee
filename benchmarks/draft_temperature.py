"""How much of the target's sampled law a draft catches at each draft temperature, teacher-forced.

    python benchmarks/draft_temperature.py --temperature 0.7 --scales 0.5,0.7,0.85,1,1.2

Rejection sampling is exact for any proposal q, so the draft may sample at a temperature of its own; what it
changes is acceptance. The target (default precision) samples each suite prompt's continuation at T; target and
draft then score that sequence in one forward each, and at every generated position we take the acceptance of
one draft token, sum_x min(p(x), q_s(x)), where p is the target at T and q_s the draft at T * s (s = 1: what
verispec drafts with today; s = 0: the draft's argmax, acceptance p(argmax q)). Positions come from the target's
own sampled text, so they weigh contexts as decoding meets them.
"""

from __future__ import annotations

import argparse
from collections import defaultdict

import torch

from verispec.bench.suite import load_prompts
from verispec.defaults import default_draft_dtype, default_draft_vocab, default_dtype
from verispec.engine import GenerationParams, generate
from verispec.models.kernels import available_isas
from verispec.models.load import default_threads, load
from verispec.models.packaged import DEFAULT_DRAFT, DEFAULT_TARGET
from verispec.sampling import SamplingParams


def logits_of(model, tokens: list[int], n_new: int) -> torch.Tensor:
    """[n_new, V] float32 logits predicting the last n_new tokens of `tokens`."""
    cache = model.new_cache(len(tokens) + 1)
    return model(torch.tensor([tokens]), cache, last_n=n_new + 1)[0, :-1].float()


def acceptance(p: torch.Tensor, draft_logits: torch.Tensor, temperature: float, scale: float) -> torch.Tensor:
    """[N] acceptance of one drafted token at each position (p [N, V] the target's law)."""
    v = draft_logits.shape[-1]
    if scale == 0:
        return p.gather(-1, draft_logits.argmax(-1, keepdim=True))[:, 0]
    q = torch.softmax(draft_logits / (temperature * scale), -1)
    return torch.minimum(p[:, :v], q).sum(-1)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--temperature", type=float, default=0.7)
    ap.add_argument("--scales", default="0,0.5,0.7,0.85,1,1.2")
    ap.add_argument("--limit", type=int, default=1, help="prompts per category")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    scales = [float(s) for s in args.scales.split(",")]
    default_threads()
    dtype = default_dtype("cpu", available_isas())
    draft_dtype = default_draft_dtype(dtype)
    vocab = default_draft_vocab(draft_dtype) or 10**9
    target = load(DEFAULT_TARGET, dtype=dtype)
    draft = load(DEFAULT_DRAFT, dtype=draft_dtype, tokenizer_like=target.tokenizer)
    tok = target.tokenizer
    print(f"target {dtype}, draft {draft_dtype} (first {vocab} ids), T = {args.temperature}")
    rates: dict[str, dict[float, list[torch.Tensor]]] = defaultdict(lambda: defaultdict(list))
    sampling = SamplingParams(temperature=args.temperature)
    for i, prompt in enumerate(load_prompts("suite", limit=args.limit)):
        ids = tok.chat(list(prompt.messages))
        out = generate(target.model, ids, GenerationParams(max_new_tokens=args.max_new_tokens, sampling=sampling,
                                                           seed=args.seed + i, eos_ids=tuple(tok.eos_ids)))
        seq, n = ids + out.token_ids, len(out.token_ids)
        p = torch.softmax(logits_of(target.model, seq, n) / args.temperature, -1)
        d = logits_of(draft.model, seq, n)[:, :min(vocab, p.shape[-1])]
        for s in scales:
            rates[prompt.category][s].append(acceptance(p, d, args.temperature, s))
        print(f"  {prompt.id}: {n} tokens", flush=True)
    head = " | ".join("argmax" if s == 0 else f"s = {s:g}" for s in scales)
    print(f"\n| category | positions | {head} |\n|---|---|" + "---|" * len(scales))
    everything: dict[float, list[torch.Tensor]] = defaultdict(list)
    for cat, by in rates.items():
        cells = []
        for s in scales:
            everything[s] += by[s]
            cells.append(f"{torch.cat(by[s]).mean():.3f}")
        print(f"| {cat} | {sum(len(x) for x in by[scales[0]])} | " + " | ".join(cells) + " |")
    print(f"| all | {sum(len(x) for x in everything[scales[0]])} | "
          + " | ".join(f"{torch.cat(everything[s]).mean():.3f}" for s in scales) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
