"""Run 1's greedy identity found 1 of 4 prompts differing: which prompt, at which token, with what logits there
(a tie?), and do a verification forward's rows equal the steps' at other context lengths than 300?"""
import json, sys
import torch
sys.path.insert(0, "benchmarks")
from cuda_check import row_invariance
from verispec.engine import GenerationParams, generate
from verispec.models.load import load
from verispec.proposers.draft_model import DraftModelProposer
from verispec.proposers.synthetic import SyntheticProposer

t = load("random:.gpu/q15", dtype="bfloat16", device="cuda", progress=False).model
d = load("random:.gpu/q05", dtype="bfloat16", device="cuda", progress=False).model
gen = torch.Generator().manual_seed(1)
prompts = [torch.randint(1000, 20000, (n,), generator=gen).tolist() for n in [17, 120, 300, 64]]
for i, prompt in enumerate(prompts):
    params = GenerationParams(max_new_tokens=64, gamma=4)
    plain = generate(t, prompt, params)
    again = generate(t, prompt, params)
    inner = DraftModelProposer(d, len(prompt) + 64 + 4 + 8, vocab_size=t.vocab_size)
    spec = generate(t, prompt, params, SyntheticProposer(inner, plain.token_ids, 0.2, t.vocab_size, seed=i, prompt_len=len(prompt)))
    j = next((j for j, (a, b) in enumerate(zip(spec.token_ids, plain.token_ids)) if a != b), None)
    line = {"prompt": i, "len": len(prompt), "plain_repeats": again.token_ids == plain.token_ids, "first_diff": j}
    if j is not None:
        cache = t.new_cache(len(prompt) + j + 8)
        x = t.forward(torch.tensor([prompt], device="cuda"), cache, last_n=1)
        cache.commit(len(prompt))
        for tok in plain.token_ids[:j]:
            x = t.forward(torch.tensor([[tok]], device="cuda"), cache)
            cache.commit(1)
        top = x[0, -1].float().topk(3)
        line.update(plain_tok=plain.token_ids[j], spec_tok=spec.token_ids[j], step_top3=[
            (round(v, 4), k) for v, k in zip(top.values.tolist(), top.indices.tolist())])
    print(json.dumps(line), flush=True)
for ctx in [17, 40, 63, 64, 65, 73, 120, 127, 128, 129, 176, 191, 192, 193, 356]:
    r = row_invariance(t, ctx, [2, 3, 4, 5])
    print(ctx, {k: (v["rows_bit_equal"], v["rows"], v["max_abs_diff"]) for k, v in r.items()}, flush=True)
