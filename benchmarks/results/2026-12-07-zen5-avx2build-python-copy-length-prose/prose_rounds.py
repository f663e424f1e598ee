"""Where auto's rounds go on prose (AVX2 build): per round, who proposed (lookup / draft model / nobody: a plain step),
how many tokens, how many accepted. python prose_rounds.py T CATEGORIES LIMIT"""
import sys, collections, statistics as st
from verispec.bench.suite import load_prompts
from verispec.engine import GenerationParams, generate
from verispec.models.load import default_threads, load
from verispec.models.packaged import DEFAULT_DRAFT, DEFAULT_TARGET
from verispec.models.quant import truncate_head
from verispec.proposers.mix import DraftNgramProposer
from verispec.sampling import SamplingParams
from verispec.strategies import StrategyOptions, make_proposer
default_threads()
T, cats, limit = float(sys.argv[1]), sys.argv[2].split(","), int(sys.argv[3])
t = load(DEFAULT_TARGET, dtype="w4a8"); d = load(DEFAULT_DRAFT, dtype="w4a8-4bit"); truncate_head(d.model, 65536)
tok = t.tokenizer
log = []
orig_p, orig_o = DraftNgramProposer.propose, DraftNgramProposer.observe
def propose(self, rows, gammas, sampling, gens, shapes=None):
    before = self.ngram_rounds
    out = orig_p(self, rows, gammas, sampling, gens, shapes)
    self._last = ("lookup" if self.ngram_rounds > before else ("draft" if out[0].tokens.numel() else "plain"), out[0].tokens.numel())
    return out
def observe(self, row, outcome):
    log.append((*self._last, outcome.num_accepted))
    return orig_o(self, row, outcome)
DraftNgramProposer.propose, DraftNgramProposer.observe = propose, observe
for cat in cats:
    log.clear()
    for i, p in enumerate(load_prompts("suite", categories=[cat], limit=limit)):
        ids = tok.chat(list(p.messages))
        prop = make_proposer("auto", t, d, len(ids) + 140, StrategyOptions(draft_context=64))
        generate(t.model, ids, GenerationParams(max_new_tokens=128, gamma=4, eos_ids=tuple(tok.eos_ids),
                 sampling=SamplingParams(temperature=T), seed=i), prop)
    by = collections.defaultdict(list)
    for src, n, acc in log:
        by[src].append((n, acc))
    print(f"{cat}, T={T}, {limit} prompts, {len(log)} rounds")
    for src, xs in sorted(by.items()):
        print(f"  {src:6s} rounds {len(xs):4d}  tokens proposed {st.mean(n for n, _ in xs):.2f}  accepted {st.mean(a for _, a in xs):.2f}"
              f"  all accepted {sum(a == n for n, a in xs) / len(xs):.2f}")
