"""A/B of one compiled sampling step against the code it replaces, in one process: the default pair as the bench
runs it, `auto` gamma <= 6, each prompt both ways in alternating order. Both ways make the same draws, so each pair
of runs must emit the same tokens (checked): the ratio is speed alone. Prints decode tok/s per prompt and the
geometric mean of new / old.

  verification  verify.verify_chain_compiled (sample.cpp's verify_row) against logits_to_probs over every position
                then verify_chain (landed, 6af9ebf)
  draft         sampling.sample_into (softmax_draw) against probs_on_vocab, sample() and the rows stacked: needs
                `git apply sample_into.patch` from the repository root at 3c34101 (not landed)

    python ab.py verification|draft [--limit 2] [--temperature 0.7] [--max-new-tokens 128]
"""
import argparse
import statistics
import sys

import verispec.proposers.draft_model as D
import verispec.verify as V
from verispec.bench.suite import load_prompts
from verispec.engine import GenerationParams, generate
from verispec.models.load import default_threads, load
from verispec.models.packaged import DEFAULT_DRAFT, DEFAULT_TARGET
from verispec.models.quant import truncate_head
from verispec.sampling import SamplingParams, sample
from verispec.strategies import StrategyOptions, make_proposer

ap = argparse.ArgumentParser()
ap.add_argument("what", choices=["verification", "draft"])
ap.add_argument("--limit", type=int, default=2)
ap.add_argument("--temperature", type=float, default=0.7)
ap.add_argument("--max-new-tokens", type=int, default=128)
args = ap.parse_args()
default_threads()
target, draft = load(DEFAULT_TARGET, dtype="w4a8"), load(DEFAULT_DRAFT, dtype="w4a8-4bit")
if args.what == "draft":  # the bench's draft proposes ids < 65536 (the verification run used the whole head)
    truncate_head(draft.model, 65536)
tok = target.tokenizer
prompts = [(p.category, tok.chat(list(p.messages))) for p in load_prompts("suite", limit=args.limit)]


def old_draft(logits, params, generator, out):
    """What draft_steps did: probs_on_vocab (softmax, then a padded copy), sample(), the row kept (stacked at the
    end; here copied into the buffer, a copy of the same size)."""
    q = D.probs_on_vocab(logits[0], params, out.shape[-1])
    token = sample(q[: logits.shape[-1]], generator)
    out[0] = q
    return token[None]


if args.what == "verification":
    module, name, old = V, "verify_chain_compiled", lambda *a, **k: None  # None: verify() runs the torch code
else:
    module, name, old = D, "sample_into", old_draft
new = getattr(module, name)


def run(prompt: list[int], n: int, seed: int, mode: str):
    setattr(module, name, new if mode == "new" else old)
    prop = make_proposer("auto", target, draft, len(prompt) + n + 8, StrategyOptions())
    params = GenerationParams(max_new_tokens=n, gamma=6, eos_ids=tuple(tok.eos_ids),
                              sampling=SamplingParams(temperature=args.temperature), seed=seed)
    return generate(target.model, prompt, params, prop)


for mode in ("old", "new"):
    run(prompts[0][1], 8, 0, mode)
ratios = []
for i, (cat, prompt) in enumerate(prompts):
    got = {}
    for mode in (("old", "new") if i % 2 == 0 else ("new", "old")):
        got[mode] = run(prompt, args.max_new_tokens, i, mode)
    assert got["old"].token_ids == got["new"].token_ids, (cat, i)
    m = {k: g.metrics for k, g in got.items()}
    tps = {k: x.decode_tokens_per_s for k, x in m.items()}
    ratios.append(tps["new"] / tps["old"])
    print(f"{cat:20s} old {tps['old']:6.2f} (verify {m['old'].verify_seconds / m['old'].rounds * 1e3:.2f} ms a round, "
          f"draft {m['old'].draft_seconds / max(m['old'].draft_forwards, 1) * 1e3:.2f} ms a step)  new {tps['new']:6.2f} "
          f"({m['new'].verify_seconds / m['new'].rounds * 1e3:.2f}, "
          f"{m['new'].draft_seconds / max(m['new'].draft_forwards, 1) * 1e3:.2f})  {ratios[-1]:.3f}x  same tokens",
          file=sys.stderr, flush=True)
print(f"new / old decode tok/s, geometric mean over {len(ratios)} prompts: {statistics.geometric_mean(ratios):.3f}x "
      f"(median {statistics.median(ratios):.3f}, min {min(ratios):.3f}, max {max(ratios):.3f})")
