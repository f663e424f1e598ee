"""How lookup rounds fare in auto: proposal lengths and acceptance (T from argv)."""
import sys, collections
from verispec.bench.suite import load_prompts
from verispec.engine import GenerationParams, generate
from verispec.models.load import default_threads, load
from verispec.models.packaged import DEFAULT_DRAFT, DEFAULT_TARGET
from verispec.models.quant import truncate_head
from verispec.sampling import SamplingParams
from verispec.strategies import StrategyOptions, make_proposer
from verispec.proposers import mix
default_threads()
T = float(sys.argv[1]); cats = sys.argv[2].split(","); limit = int(sys.argv[3]) if len(sys.argv) > 3 else 1
target = load(DEFAULT_TARGET, dtype="w4a8"); draft = load(DEFAULT_DRAFT, dtype="w4a8-4bit"); truncate_head(draft.model, 65536)
tok = target.tokenizer
log = []
orig_p, orig_o = mix.DraftNgramProposer.propose, mix.DraftNgramProposer.observe
def propose(self, rows, gammas, *a, **k):
    out = orig_p(self, rows, gammas, *a, **k)
    self._last = [(self.ngrams[r].last_match_len >= self.min_match and p.q is None, p.tokens.numel(), g) for r, p, g in zip(rows, out, gammas)]
    return out
def observe(self, row, outcome):
    if getattr(self, "_last", None):
        f, n, g = self._last[0]; log.append((f, n, outcome.num_accepted, g)); self._last = None
    return orig_o(self, row, outcome)
mix.DraftNgramProposer.propose, mix.DraftNgramProposer.observe = propose, observe
for cat in cats:
    ps = [tok.chat(list(p.messages)) for p in load_prompts("suite", categories=[cat], limit=limit)]
    log.clear()
    for i, p in enumerate(ps):
        prop = make_proposer("auto", target, draft, len(p) + 160, StrategyOptions())
        generate(target.model, p, GenerationParams(max_new_tokens=128, gamma=6, eos_ids=tuple(tok.eos_ids), sampling=SamplingParams(temperature=T), seed=i), prop)
    look = [(n, a) for f, n, a, g in log if f]; dr = [(n, a) for f, n, a, g in log if not f and n > 0]; plain = sum(1 for f, n, a, g in log if n == 0)
    full = sum(1 for n, a in look if a == n and n == 6)
    print(f"{cat}: rounds {len(log)}, lookup {len(look)} (len hist {dict(collections.Counter(n for n, a in look))}, acc mean {sum(a for n,a in look)/max(1,len(look)):.2f}, full-6 {full}), "
          f"draft {len(dr)} (acc mean {sum(a for n,a in dr)/max(1,len(dr)):.2f}, len mean {sum(n for n,a in dr)/max(1,len(dr)):.2f}), plain {plain}", flush=True)
