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
4. Where rows part (`divergence`): every linear, RMSNorm and attention call of a k-token forward against the same
   call in the k one-token steps -- the op kinds whose output rows differ although their input rows were equal,
   and whether the same forward gives the same bits twice. Ways that pick one of torch's attention backends
   (`math`, `flash`, `efficient`, `cudnn`) or deterministic algorithms (`deterministic`) say which choice is exact.

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


@contextmanager
def recording(model) -> Iterator[list[tuple[str, torch.Tensor, torch.Tensor]]]:
    """(name, input, output) of every linear, RMSNorm and attention call the model makes, in order."""
    calls: list[tuple[str, torch.Tensor, torch.Tensor]] = []
    hooks = [m.register_forward_hook(lambda mod, inp, out, name=name: calls.append((name, inp[0].clone(), out.clone())))
             for name, m in model.named_modules() if isinstance(m, (llama.Linear, llama.RMSNorm))]
    plain = llama.attention

    def attention(*args, **kwargs):
        attend = plain(*args, **kwargs)

        def recorded(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            out = attend(q, k, v)
            calls.append(("attention", q.transpose(1, 2).clone(), out.transpose(1, 2).clone()))  # [B, T, H, D]
            return out

        return recorded

    llama.attention = attention
    try:
        yield calls
    finally:
        llama.attention = plain
        for h in hooks:
            h.remove()


def divergence(model, context: int, k: int, seed: int = 0) -> dict:
    """Per op kind (wqkv, wo, w13, w2, attn_norm, ffn_norm, norm, lm_head, attention): calls of a k-token forward
    whose input rows were bit-equal to the one-token steps' and how many of those gave a row other bits; the first
    such call; and whether the k-token forward and a step give the same bits when run again."""
    cache, new = primed(model, context, k, seed)
    steps = []
    for i in range(k):
        with recording(model) as calls:
            model.forward(new[:, i : i + 1], cache)
        steps.append(calls)
        cache.commit(1)
    cache.rollback(k)
    with recording(model) as wide:
        first = model.forward(new, cache)
    again = model.forward(new, cache)
    cache.commit(k - 1)
    cache.rollback(1)
    step_again = [model.forward(new[:, k - 1 :], cache) for _ in range(2)]
    kinds: dict[str, list[int]] = {}
    first_part = None
    for j, (name, inp, out) in enumerate(wide):
        kind = name.rsplit(".", 1)[-1]
        for i in range(k):
            s_name, s_inp, s_out = steps[i][j]
            assert s_name == name, (s_name, name)
            if not torch.equal(inp.reshape(-1, *inp.shape[2:])[i], s_inp.reshape(-1, *s_inp.shape[2:])[0]):
                continue
            tally = kinds.setdefault(kind, [0, 0])
            tally[0] += 1
            if not torch.equal(out.reshape(-1, *out.shape[2:])[i], s_out.reshape(-1, *s_out.shape[2:])[0]):
                tally[1] += 1
                first_part = first_part or f"{name} (call {j}, row {i})"
    return {"equal_in_differing_out": kinds, "first": first_part, "wide_repeats": torch.equal(first, again),
            "step_repeats": torch.equal(*step_again)}


@contextmanager
def unfused_bias() -> Iterator[None]:
    """Every linear layer with a bias adds it after the matmul instead of in it (cuBLASLt's fused epilogue)."""
    plain = llama.Linear.forward

    def forward(self: llama.Linear, x: torch.Tensor) -> torch.Tensor:
        return plain(self, x) if self.bias is None else F.linear(x, self.weight) + self.bias

    llama.Linear.forward = forward  # type: ignore[method-assign]
    try:
        yield
    finally:
        llama.Linear.forward = plain  # type: ignore[method-assign]


@contextmanager
def one_query_calls() -> Iterator[None]:
    """Queries attended one call each (llama.one_query_attention) instead of in one Triton launch."""
    from verispec.models import triton_attention

    plain = triton_attention.available
    triton_attention.available = lambda device="cuda": False
    try:
        yield
    finally:
        triton_attention.available = plain


@contextmanager
def deterministic() -> Iterator[None]:
    torch.use_deterministic_algorithms(True)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(False)


@contextmanager
def way(name: str, pad: int) -> Iterator[None]:
    """One way of running the model, or several joined by '&': as run, rows padded (linear, linear+norm), one
    attention backend (math, flash, efficient, cudnn), bias added after the matmul (unfused-bias), deterministic
    algorithms (deterministic), each query in its own call instead of one Triton launch (one-query-calls)."""
    from contextlib import ExitStack

    from torch.nn.attention import SDPBackend, sdpa_kernel

    backends = {"math": SDPBackend.MATH, "flash": SDPBackend.FLASH_ATTENTION,
                "efficient": SDPBackend.EFFICIENT_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION}
    padding = {"as run": (0, False), "linear": (pad, False), "linear+norm": (pad, True)}
    with ExitStack() as stack:
        for part in name.split("&"):
            if part in padding:
                stack.enter_context(padded_rows(*padding[part]))
            elif part in backends:
                stack.enter_context(sdpa_kernel([backends[part]]))
            elif part == "unfused-bias":
                stack.enter_context(unfused_bias())
            elif part == "deterministic":
                stack.enter_context(deterministic())
            elif part == "one-query-calls":
                stack.enter_context(one_query_calls())
            else:
                raise SystemExit(f"unknown way {part!r}")
        yield


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def primed(model, context: int, k: int, seed: int) -> tuple[object, torch.Tensor]:
    """A cache holding a random prompt of `context` tokens, and k random tokens [1, k] to go on with."""
    gen = torch.Generator().manual_seed(seed)
    prompt = torch.randint(1000, 20000, (1, context), generator=gen).to(model.device)
    new = torch.randint(1000, 20000, (1, k), generator=gen).to(model.device)
    cache = model.new_cache(context + k + 2)
    model.forward(prompt, cache, last_n=1)
    cache.commit(context)
    return cache, new


def row_invariance(model, context: int, widths: list[int], seed: int = 0) -> dict[int, dict]:
    """Per k: rows of a k-token forward bit-equal to the one-token steps', the largest |logit difference|, and
    argmaxes that differ."""
    k_max = max(widths)
    cache, new = primed(model, context, k_max, seed)
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
    ap.add_argument("--ways", default="as run,linear,linear+norm", help="comma list of ways (see `way`), "
                    "e.g. 'as run,math,unfused-bias&math'; deterministic wants CUBLAS_WORKSPACE_CONFIG=:4096:8")
    ap.add_argument("--no-timing", action="store_true")
    ap.add_argument("--no-identity", action="store_true", help="skip the greedy identity runs (12-60 s a way)")
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
    for name in args.ways.split(","):
        with way(name, args.pad):
            r = results[name] = {}
            r["row_invariance"] = timed(f"{name}: row invariance", lambda: row_invariance(t, args.context, widths))
            r["divergence"] = timed(f"{name}: where rows part", lambda: {
                k: divergence(t, args.context, k) for k in (2, 5)})
            if not args.no_identity:
                r["greedy_identity"] = timed(f"{name}: greedy identity", lambda: identity(
                    t, d, prompts, 4, args.new_tokens, 0.2))
            if args.no_timing:
                continue
            r["target_ms"] = timed(f"{name}: target forward ms by k", lambda: {
                k: round(forward_ms(t, args.context, k), 3) for k in [1, 2, 4, 8, 16, 32, 64]})
            r["draft_ms"] = timed(f"{name}: draft one-token forward ms", lambda: round(forward_ms(d, args.context, 1), 3))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
