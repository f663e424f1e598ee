"""What a target forward over k tokens costs inside decoding rounds, against a one-token step in the same minutes.

    VERISPEC_KERNEL_ISA=avx2 python benchmarks/verify_cost_in_round.py [--category translation] [--gammas 1,2,4]

Runs the draft strategy at each gamma (k = gamma + 1 tokens a round) alternated with plain decoding on one suite
prompt, times every target forward the round makes, and prints the median ms per k and its ratio to k = 1. A
curve timed by forwards in a row (`bench --costs`) prices k tokens against a step timed minutes apart; on a VM whose
memory bandwidth drifts, a memory-bound step and a compute-bound k-token forward drift differently.
"""

from __future__ import annotations

import argparse
import collections
import statistics
import time

import verispec.batch as batch
from verispec.bench.suite import load_prompts
from verispec.engine import GenerationParams, generate
from verispec.models.kernels import cpu_flags, cpu_model, kernel_isa
from verispec.models.load import default_threads, load
from verispec.models.packaged import DEFAULT_DRAFT, DEFAULT_TARGET
from verispec.models.quant import truncate_head
from verispec.strategies import StrategyOptions, make_proposer


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--category", default="translation")
    ap.add_argument("--gammas", default="1,2,4")
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    default_threads()
    target = load(DEFAULT_TARGET, dtype="w4a8")
    draft = load(DEFAULT_DRAFT, dtype="w4a8-4bit")
    truncate_head(draft.model, 65536)
    tok = target.tokenizer
    times: dict[int, list[float]] = collections.defaultdict(list)
    forward = batch.NativeRows.forward

    def timed(self, rows, chains, **kw):  # the target's decoding forwards (its prefill is one last_only call)
        t0 = time.perf_counter()
        out = forward(self, rows, chains, **kw)
        if self.model is target.model and (not kw.get("last_only") or len(chains[0]) == 1):
            times[len(chains[0])].append(time.perf_counter() - t0)
        return out

    batch.NativeRows.forward = timed
    ids = tok.chat(list(load_prompts("suite", categories=[args.category], limit=1)[0].messages))
    for _ in range(args.reps):
        for g in (int(x) for x in args.gammas.split(",")):
            proposer = make_proposer("draft", target, draft, len(ids) + 140, StrategyOptions())
            generate(target.model, ids, GenerationParams(max_new_tokens=64, gamma=g, eos_ids=tuple(tok.eos_ids)), proposer)
            generate(target.model, ids, GenerationParams(max_new_tokens=32, gamma=1, eos_ids=tuple(tok.eos_ids)), None)
    base = statistics.median(times[1])
    vnni = "avx512_vnni" if "avx512_vnni" in cpu_flags() else "no avx512_vnni"
    print(f"{cpu_model()}, {vnni}, kernel build {kernel_isa()}; {args.category} prompt, {args.reps} repetitions\n")
    print("| tokens a forward | forwards | median ms | × one token |\n|---|---|---|---|")
    for k, v in sorted(times.items()):
        if len(v) >= 5:
            print(f"| {k} | {len(v)} | {1e3 * statistics.median(v):.1f} | {statistics.median(v) / base:.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
