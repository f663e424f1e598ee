"""The target's k-token forward timed alone in a row, and right after a draft forward (as inside a round), interleaved."""
import statistics as st, sys, time
import torch
from verispec.bench.suite import load_prompts
from verispec.defaults import default_draft_dtype
from verispec.models.load import default_threads, load
from verispec.models.packaged import DEFAULT_DRAFT, DEFAULT_TARGET
from verispec.models.quant import truncate_head
from verispec.batch import make_rows, prefill_rows

default_threads()
target = load(DEFAULT_TARGET, dtype="w4a8", progress=False)
draft = load(DEFAULT_DRAFT, dtype=default_draft_dtype("w4a8", "cpu"), progress=False)
truncate_head(draft.model, 65536)
tok = target.tokenizer
prompt = tok.chat(list(next(p for p in load_prompts("suite") if p.id == "translation-04").messages))
T = make_rows(target.model, 1, len(prompt) + 64, 20)
D = make_rows(draft.model, 1, len(prompt) + 64, 20)
prefill_rows(T, [0], [prompt[:-1]]); prefill_rows(D, [0], [prompt[-65:-1]])
reps = int(sys.argv[1]) if len(sys.argv) > 1 else 30
ks = [int(k) for k in (sys.argv[2] if len(sys.argv) > 2 else "1,2,5").split(",")]
def tf(k):
    t = time.perf_counter(); T.forward([0], [prompt[-k:]], hidden=True); return time.perf_counter() - t
def df(n=1):
    t = time.perf_counter(); D.forward([0], [prompt[-n:]], last_only=True); return time.perf_counter() - t
res = {}
with torch.no_grad():
    for _ in range(3):
        for k in ks: tf(k); df()
    for i in range(reps):
        for k in ks:
            res.setdefault(("row", k), []).append(tf(k))          # after a target forward
            df(); res.setdefault(("after-draft", k), []).append(tf(k))  # right after a draft forward
            time.sleep(0.001); res.setdefault(("after-1ms-idle", k), []).append(tf(k))
one = st.median(res[("row", 1)])
for key in sorted(res, key=lambda x: (x[1], x[0])):
    print(f"{key[0]:15s} k={key[1]}: median {1000*st.median(res[key]):.2f} ms = {st.median(res[key])/one:.2f}x the in-a-row step")
