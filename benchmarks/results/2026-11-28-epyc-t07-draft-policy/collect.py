"""Offline: the acceptance a draft sampled at temperature Td would get against the target at T = 0.7."""
import sys, time, torch, json
from verispec.bench.suite import load_prompts
from verispec.engine import GenerationParams, generate
from verispec.models.load import default_threads, load
from verispec.models.packaged import DEFAULT_DRAFT, DEFAULT_TARGET
from verispec.models.quant import truncate_head
from verispec.sampling import SamplingParams
default_threads()
T = 0.7
target = load(DEFAULT_TARGET, dtype="w4a8"); draft = load(DEFAULT_DRAFT, dtype="w4a8-4bit")
truncate_head(draft.model, 65536)
tok = target.tokenizer
limit = int(sys.argv[1]) if len(sys.argv) > 1 else 2
ps = load_prompts("suite", limit=limit)
out = []
for i, p in enumerate(ps):
    prompt = tok.chat(list(p.messages))
    g = generate(target.model, prompt, GenerationParams(max_new_tokens=96, gamma=1, eos_ids=tuple(tok.eos_ids),
                 sampling=SamplingParams(temperature=T), seed=i))
    seq = prompt + g.token_ids
    n = len(g.token_ids)
    with torch.inference_mode():
        lt = target.model.forward(torch.tensor([seq]), target.model.new_cache(len(seq) + 4), last_n=n)[0]
        ld = draft.model.forward(torch.tensor([seq]), draft.model.new_cache(len(seq) + 4), last_n=n)[0]
    # position j predicts g.token_ids[j]... last_n=n gives logits after tokens seq[-n:], i.e. predicting outputs 1..n; shift
    out.append({"cat": p.category, "lt": lt[:-1].float().half(), "ld": ld[:-1, :65536].float().half()})
    print(i, p.category, n, file=sys.stderr)
torch.save(out, "logits.pt")
