import collections, statistics, time, sys
import verispec.batch as batch
from verispec.bench.suite import load_prompts
from verispec.engine import GenerationParams, generate
from verispec.models.kernels import kernel_isa
from verispec.models.load import default_threads, load
from verispec.models.packaged import DEFAULT_DRAFT, DEFAULT_TARGET
from verispec.models.quant import truncate_head
from verispec.strategies import StrategyOptions, make_proposer
from verispec.proposers.draft_model import DraftModelProposer
default_threads()
target = load(DEFAULT_TARGET, dtype="w4a8"); draft = load(DEFAULT_DRAFT, dtype="w4a8-4bit"); truncate_head(draft.model, 65536)
tok = target.tokenizer
times = collections.defaultdict(list); mode = ["ar"]
forward = batch.NativeRows.forward
def timed(self, rows, chains, **kw):
    t0 = time.perf_counter(); out = forward(self, rows, chains, **kw)
    who = "T" if self.model is target.model else "D"
    if not (who == "T" and kw.get("last_only") and len(chains[0]) > 1):
        times[(mode[0], who, len(chains[0]))].append(time.perf_counter() - t0)
    return out
batch.NativeRows.forward = timed
dm_forward = draft.model.forward
def dtimed(*a, **k):
    t0 = time.perf_counter(); o = dm_forward(*a, **k); times[(mode[0], "Dmodel", a[0].shape[1])].append(time.perf_counter() - t0); return o
draft.model.forward = dtimed
prop_orig = DraftModelProposer.propose
def ptimed(self, *a, **k):
    t0 = time.perf_counter(); o = prop_orig(self, *a, **k); times[(mode[0], "propose", sum(p.tokens.numel() for p in o))].append(time.perf_counter() - t0); return o
DraftModelProposer.propose = ptimed
cat = sys.argv[1] if len(sys.argv) > 1 else "code_completion"
ps = load_prompts("suite", categories=[cat], limit=2)
for rep in range(2):
  for p in ps:
    ids = tok.chat(list(p.messages))
    for m in ("ar", "draft"):
        mode[0] = m
        prop = None if m == "ar" else make_proposer(m, target, draft, len(ids) + 140, StrategyOptions())
        generate(target.model, ids, GenerationParams(max_new_tokens=96, gamma=4, eos_ids=tuple(tok.eos_ids)), prop)
print(kernel_isa())
for k, v in sorted(times.items()):
    print(k, len(v), f"{1e3*statistics.median(v):.2f} ms  mean {1e3*statistics.mean(v):.2f}")
