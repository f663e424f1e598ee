"""Is greedy speculation exact on a GPU, and what does a round cost there? One run on a lent GPU machine.

Random weights of the real shapes (`random:DIR`, a config and tokenizer only: the real weights cannot travel to a
lent machine), bfloat16 on CUDA:

0. Which row-wise ops (linear, RMSNorm, SiLU) give a row other bits in a k-row call than alone.
1. Row invariance: the logits a k-token verification forward gives each of its tokens against the ones k
   one-token decoding steps give them, bit for bit, for k = 2 .. 16 -- `--ways`: as the model runs, with every
   linear's rows padded to a fixed count (`--pad`, the CPU's remedy: one kernel for every width), and with the
   RMSNorms' padded too. Greedy speculation equals plain decoding only where these agree.
2. Greedy identity: plain decoding against the draft model's chain (synthetic acceptance, so that rounds accept
   and roll back) over several prompts, both ways.
3. Costs: the target's forward over k tokens, the draft's one-token forward (c), both ways.

    python benchmarks/cuda_check.py --target random:DIR --draft random:DIR [--device cuda] [--pad 16]
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch
import torch.nn.functional as F

from verispec.bench.stats import median
from verispec.engine import GenerationParams, generate
from verispec.models import llama
from verispec.models.load import load
from verispec.proposers.draft_model import DraftModelProposer
from verispec.proposers.synthetic import SyntheticProposer


def pad_rows(fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, pad: int) -> torch.Tensor:
    """fn (row-wise) of x [..., F], run over exactly `pad` rows (zeros below) where x has fewer."""
    rows = x.numel() // x.shape[-1]
    flat = torch.cat([x.reshape(rows, x.shape[-1]), x.new_zeros(pad - rows, x.shape[-1])])
    out = fn(flat)[:rows]
    return out.reshape(*x.shape[:-1], out.shape[-1])


def op_rows(device: torch.device, dtype: torch.dtype, pad: int) -> dict:
    """Which row-wise ops give a row different bits in a k-row call than in a one-row call (k = 2 .. 16)."""
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(16, 1536, generator=gen).to(device, dtype)
    w = (0.03 * torch.randn(8960, 1536, generator=gen)).to(device, dtype)
    w2 = (0.03 * torch.randn(1536, 8960, generator=gen)).to(device, dtype)
    h = torch.randn(16, 8960, generator=gen).to(device, dtype)
    norm = llama.RMSNorm(1536, 1e-6).to(device, dtype)
    ops = {"linear 1536->8960": (lambda t: F.linear(t, w), x), "linear 8960->1536": (lambda t: F.linear(t, w2), h),
           "rmsnorm": (norm.forward, x), "silu*x": (lambda t: F.silu(t) * t, x),
           "linear padded": (lambda t: pad_rows(lambda u: F.linear(u, w), t, pad), x),
           "rmsnorm padded": (lambda t: pad_rows(norm.forward, t, pad), x)}
    out = {}
    with torch.inference_mode():
        for name, (fn, inp) in ops.items():
            one = torch.cat([fn(inp[i : i + 1]) for i in range(16)])
            out[name] = [k for k in (2, 3, 4, 5, 8, 16) if not torch.equal(fn(inp[:k]), one[:k])]
    return out  # the k at which some row differs


@contextmanager
def padded_rows(pad: int, norms: bool = False) -> Iterator[None]:
    """Every linear layer's forward (and with `norms`, every RMSNorm's) of fewer than `pad` rows runs as exactly
    `pad` rows (zeros below), then keeps its own."""
    plain, plain_norm = llama.Linear.forward, llama.RMSNorm.forward

    def forward(self: llama.Linear, x: torch.Tensor) -> torch.Tensor:
        rows = x.numel() // x.shape[-1]
        if pad == 0 or rows >= pad:
            return plain(self, x)
        return pad_rows(lambda u: F.linear(u, self.weight, self.bias), x, pad)

    def norm(self: llama.RMSNorm, x: torch.Tensor) -> torch.Tensor:
        rows = x.numel() // x.shape[-1]
        return plain_norm(self, x) if rows >= pad else pad_rows(lambda u: plain_norm(self, u), x, pad)

    llama.Linear.forward = forward  # type: ignore[method-assign]
    if norms:
        llama.RMSNorm.forward = norm  # type: ignore[method-assign]
    try:
        yield
    finally:
        llama.Linear.forward, llama.RMSNorm.forward = plain, plain_norm  # type: ignore[method-assign]


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def row_invariance(model, context: int, widths: list[int], seed: int = 0) -> dict[int, dict]:
    """Per k: rows of a k-token forward bit-equal to the one-token steps', the largest |logit difference|, and
    argmaxes that differ."""
    gen = torch.Generator().manual_seed(seed)
    k_max = max(widths)
    prompt = torch.randint(1000, 20000, (1, context), generator=gen).to(model.device)
    new = torch.randint(1000, 20000, (1, k_max), generator=gen).to(model.device)
    cache = model.new_cache(context + k_max + 2)
    model.forward(prompt, cache, last_n=1)
    cache.commit(context)
    steps = []
    for i in range(k_max):
        steps.append(model.forward(new[:, i : i + 1], cache)[0, -1].float())
        cache.commit(1)
    cache.rollback(k_max)
    out = {}
    for k in widths:
        wide = model.forward(new[:, :k], cache)[0].float()
        ref = torch.stack(steps[:k])
        out[k] = {"rows_bit_equal": int((wide == ref).all(-1).sum()), "rows": k,
                  "max_abs_diff": float((wide - ref).abs().max()),
                  "argmax_differs": int((wide.argmax(-1) != ref.argmax(-1)).sum())}
    return out


def forward_ms(model, context: int, k: int, reps: int = 15) -> float:
    cache = model.new_cache(context + k + 1)
    model.forward(torch.randint(1000, 20000, (1, context), device=model.device), cache, last_n=1)
    cache.commit(context)
    x = torch.randint(1000, 20000, (1, k), device=model.device)
    times = []
    for _ in range(reps + 3):
        sync(model.device)
        t0 = time.perf_counter()
        model.forward(x, cache, last_n=None if k > 1 else 1)
        sync(model.device)
        times.append(time.perf_counter() - t0)
    return 1000 * median(times[3:])


def identity(target, draft, prompts: list[list[int]], gamma: int, new_tokens: int, error: float) -> dict:
    """Plain greedy decoding against the draft's chain with synthetic acceptance: outputs that differ."""
    differ, firsts, accepted, drafted = 0, [], 0, 0
    for i, prompt in enumerate(prompts):
        plain = generate(target, prompt, GenerationParams(max_new_tokens=new_tokens, gamma=gamma))
        inner = DraftModelProposer(draft, len(prompt) + new_tokens + gamma + 8, vocab_size=target.vocab_size)
        proposer = SyntheticProposer(inner, plain.token_ids, error, target.vocab_size, seed=i, prompt_len=len(prompt))
        spec = generate(target, prompt, GenerationParams(max_new_tokens=new_tokens, gamma=gamma), proposer)
        accepted, drafted = accepted + spec.metrics.accepted, drafted + spec.metrics.drafted
        if spec.token_ids != plain.token_ids:
            differ += 1
            firsts.append(next(j for j, (a, b) in enumerate(zip(spec.token_ids, plain.token_ids)) if a != b))
    return {"prompts": len(prompts), "differ": differ, "first_difference_at": firsts,
            "alpha": round(accepted / max(1, drafted), 3)}


def timed(label: str, fn: Callable[[], dict | float]) -> dict | float | str:
    t0 = time.perf_counter()
    try:
        out = fn()
    except Exception as e:  # noqa: BLE001 -- one failing section must not cost the run's others
        out = f"failed: {type(e).__name__}: {e}"
    print(f"{label} ({time.perf_counter() - t0:.1f} s): {json.dumps(out)}", flush=True)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", required=True)
    ap.add_argument("--draft", required=True)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--pad", type=int, default=16, help="rows every linear forward is padded to, the second way")
    ap.add_argument("--context", type=int, default=300)
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--out", default=None, help="write the figures here as JSON")
    ap.add_argument("--ways", default="as run,linear,linear+norm", help="comma list of: as run, linear, linear+norm")
    ap.add_argument("--no-timing", action="store_true")
    args = ap.parse_args()
    t = load(args.target, dtype=args.dtype, device=args.device, progress=False).model
    d = load(args.draft, dtype=args.dtype, device=args.device, progress=False).model
    device = t.device
    info = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
            "torch": torch.__version__, "dtype": args.dtype}
    print(json.dumps(info), flush=True)
    gen = torch.Generator().manual_seed(1)
    prompts = [torch.randint(1000, 20000, (n,), generator=gen).tolist() for n in [17, 120, 300, 64][: args.prompts]]
    widths = [2, 3, 4, 5, 8, 16]
    results: dict = {"info": info}
    results["op_rows"] = timed("ops whose rows differ at k rows", lambda: op_rows(device, t.dtype, args.pad))
    ways = {"as run": (0, False), "linear": (args.pad, False), "linear+norm": (args.pad, True)}
    for way in args.ways.split(","):
        with padded_rows(*ways[way]):
            r = results[way] = {}
            r["row_invariance"] = timed(f"{way}: row invariance", lambda: row_invariance(t, args.context, widths))
            r["greedy_identity"] = timed(f"{way}: greedy identity", lambda: identity(
                t, d, prompts, 4, args.new_tokens, 0.2))
            if args.no_timing:
                continue
            r["target_ms"] = timed(f"{way}: target forward ms by k", lambda: {
                k: round(forward_ms(t, args.context, k), 3) for k in [1, 2, 4, 8, 16, 32, 64]})
            r["draft_ms"] = timed(f"{way}: draft one-token forward ms", lambda: round(forward_ms(d, args.context, 1), 3))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
