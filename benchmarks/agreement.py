"""How far a quantized target is from the bf16 target: top-1 agreement and KL, teacher-forced.

    python benchmarks/agreement.py --dtypes w8a8,w4a8,w4a8-4bit

The bf16 target (the GGUF dequantized) decodes each suite prompt greedily; every precision then scores that
same token sequence in one forward, and at each generated position we compare its top-1 token with bf16's
and take KL(bf16 || it). Speculation is lossless relative to the target as run; this says how close the
target as run is to the faithful one.
"""

from __future__ import annotations

import argparse

import torch

from verispec.bench.suite import load_prompts
from verispec.engine import GenerationParams, generate
from verispec.models.load import default_threads, load
from verispec.models.packaged import DEFAULT_TARGET


def scores(model, tokens: list[int], n_new: int) -> torch.Tensor:
    cache = model.new_cache(len(tokens) + 1)
    logits = model(torch.tensor([tokens]), cache, last_n=n_new + 1)[0, :-1]  # predictions of the generated tokens
    return torch.log_softmax(logits.float(), dim=-1)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dtypes", default="w8a8,w4a8,w4a8-4bit")
    ap.add_argument("--categories", default="code_completion,code_instruct,multi_turn,summarization")
    ap.add_argument("--limit", type=int, default=1, help="prompts per category")
    ap.add_argument("--max-new-tokens", type=int, default=48)
    args = ap.parse_args()
    default_threads()
    ref = load(DEFAULT_TARGET, dtype="bfloat16", progress=True)
    tok = ref.tokenizer
    seqs = []
    for p in load_prompts("suite", categories=args.categories.split(","), limit=args.limit):
        prompt = tok.chat(list(p.messages))
        out = generate(ref.model, prompt, GenerationParams(max_new_tokens=args.max_new_tokens, eos_ids=tuple(tok.eos_ids)))
        seqs.append((prompt + out.token_ids, len(out.token_ids)))
    base = [scores(ref.model, s, n) for s, n in seqs]
    del ref
    print("| target | top-1 agreement with bf16 | mean KL(bf16 ‖ it) | max KL |")
    print("|---|---|---|---|")
    for dtype in args.dtypes.split(","):
        model = load(DEFAULT_TARGET, dtype=dtype, progress=True).model
        agree = total = 0
        kls = []
        for (s, n), b in zip(seqs, base):
            q = scores(model, s, n)
            agree += int((q.argmax(-1) == b.argmax(-1)).sum())
            total += n
            kls.append((b.exp() * (b - q)).sum(-1))
        kl = torch.cat(kls)
        print(f"| {dtype} | {agree}/{total} | {kl.mean():.4f} | {kl.max():.3f} |", flush=True)
        del model
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
