"""Offline: how many tokens would a corpus n-gram drafter (the stdlib, stdlib_corpus.py) get accepted on a bench run's
greedy outputs, where the prompt lookup of `auto` (3-token matches) finds nothing?

    python corpus_lookup_sim.py NMAX NMIN CMIN SHARE RUNS.jsonl   (env CORPUS=stdlib.npy TOKENIZER_DIR=...)

NMAX..NMIN: suffix lengths looked up, longest first; a continuation needs CMIN occurrences and SHARE of them."""
import json, os, sys, numpy as np, collections
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
from verispec.models.tokenizer import Tokenizer
from verispec.proposers.ngram import NgramProposer
arr = np.load(os.environ.get('CORPUS', 'stdlib.npy')).astype(np.int64)
P = np.int64(1000003); M = (1 << 61) - 1
NMAX, NMIN = int(sys.argv[1]) if len(sys.argv) > 1 else 6, int(sys.argv[2]) if len(sys.argv) > 2 else 2
CMIN = int(sys.argv[3]) if len(sys.argv) > 3 else 2
SHARE = float(sys.argv[4]) if len(sys.argv) > 4 else 0.5
def hkeys(a, n):  # hash of a[i-n+1..i] for i >= n-1 (python ints avoided: use uint64 wraparound)
    a = a.astype(np.uint64) + np.uint64(7)
    h = np.zeros(a.size - n + 1, dtype=np.uint64)
    for j in range(n):
        h = h * np.uint64(1000003) + a[j:a.size - n + 1 + j]
    return h
tables = {}
for n in range(NMIN, NMAX + 1):
    k = hkeys(arr[:-1], n); nxt = arr[n:]
    ok = nxt >= 0
    k, nxt = k[ok], nxt[ok]
    o = np.lexsort((nxt, k)); k, nxt = k[o], nxt[o]
    new = np.r_[True, (k[1:] != k[:-1]) | (nxt[1:] != nxt[:-1])]
    idx = np.flatnonzero(new); cnt = np.diff(np.r_[idx, k.size])
    pk, pn = k[idx], nxt[idx]
    # per key: best next and its count, and the key's total
    newk = np.r_[True, pk[1:] != pk[:-1]]; kidx = np.flatnonzero(newk)
    tot = np.add.reduceat(cnt, kidx)
    best = np.maximum.reduceat(cnt, kidx)
    # the next token with the best count: first in the run whose count == best
    run = np.repeat(np.arange(kidx.size), np.diff(np.r_[kidx, pk.size]))
    isbest = cnt == best[run]
    first = np.r_[True, run[1:] != run[:-1]]
    # choose first isbest in each run
    cand = np.flatnonzero(isbest)
    cr = run[cand]; keep = np.r_[True, cr[1:] != cr[:-1]]
    tables[n] = (pk[kidx], pn[cand[keep]], best, tot)
def hash_ctx(ctx):
    h = np.uint64(0)
    for t in ctx:
        h = h * np.uint64(1000003) + np.uint64(t + 7)
    return h
def corpus_next(ctx):
    for n in range(NMAX, NMIN - 1, -1):
        if len(ctx) < n: continue
        keys, nx, best, tot = tables[n]
        h = hash_ctx(ctx[-n:])
        i = np.searchsorted(keys, h)
        if i < keys.size and keys[i] == h:
            if best[i] >= CMIN and best[i] >= SHARE * tot[i]:
                return int(nx[i]), n
            return None
    return None
def corpus_propose(ctx, g):
    out = []
    c = list(ctx[-NMAX:])
    for _ in range(g):
        r = corpus_next(c)
        if r is None: break
        out.append(r[0]); c = (c + [r[0]])[-NMAX:]
    return out
tok = Tokenizer.from_dir(os.environ['TOKENIZER_DIR'])
suite = {json.loads(l)['id']: json.loads(l) for l in open(Path(__file__).resolve().parents[3] / 'verispec/bench/data/suite.jsonl')}
runs = [json.loads(l) for l in open(sys.argv[5])]
runs = [r for r in runs if r['config'] == 'ar']
G = 6
agg = collections.defaultdict(lambda: collections.Counter())
for r in runs:
    prompt = tok.chat(list(suite[r['prompt_id']]['messages']))
    out = r['token_ids']
    ng = NgramProposer(3, 3); ng.reset(prompt)
    p = 0; cat = r['category']
    while p < len(out):
        ctx = prompt + out[:p]
        a, n = ng.lookup(G)
        src = 'ngram' if a and n >= 3 else None
        if src is None:
            a = corpus_propose(ctx, G); src = 'corpus' if a else 'none'
        acc = 0
        while acc < len(a) and p + acc < len(out) and a[acc] == out[p + acc]: acc += 1
        agg[cat][src + '_rounds'] += 1; agg[cat][src + '_acc'] += acc; agg[cat][src + '_prop'] += len(a)
        step = acc + 1
        ng._extend(out[p:p + step]); p += step
for cat, c in agg.items():
    s = ' '.join(f"{k}:r{c[k+'_rounds']} acc{c[k+'_acc']/max(1,c[k+'_rounds']):.2f}/prop{c[k+'_prop']/max(1,c[k+'_rounds']):.2f}" for k in ('ngram', 'corpus', 'none'))
    print(f'{cat:16s} {s}')
