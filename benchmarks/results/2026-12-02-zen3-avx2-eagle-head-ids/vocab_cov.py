"""Coverage of the target's greedy suite outputs by a draft vocabulary: the first N ids against the N ids most
frequent in train-drafter's default corpus, the Python standard library's source (verispec.train_drafter.stdlib_texts,
tokenized by the target's tokenizer).

    python vocab_cov.py TOKENIZER_JSON RUNS_JSONL_GZ
"""
import collections
import gzip
import json
import sys

from tokenizers import Tokenizer

from verispec.train_drafter import stdlib_texts

tok = Tokenizer.from_file(sys.argv[1])
freq: collections.Counter = collections.Counter()
chars = 0
for text in stdlib_texts():
    freq.update(tok.encode(text).ids)
    chars += len(text)
print(f"stdlib: {chars / 1e6:.1f} M chars, {sum(freq.values()) / 1e6:.2f} M tokens, {len(freq)} distinct ids")
ranked = sorted(freq, key=lambda t: (-freq[t], t))  # as frequent_ids: ties by id
sizes = (4096, 8192, 16384, 32000)
top = {n: set(ranked[:n]) for n in sizes}
counts: dict = collections.defaultdict(collections.Counter)
for line in gzip.open(sys.argv[2], "rt"):
    d = json.loads(line)
    if d["config"] != "ar" or d["system"] != "verispec":
        continue
    cat = "code" if d["category"].startswith("code") else "other"
    for t in d["token_ids"]:
        counts[cat]["n"] += 1
        for n in sizes:
            counts[cat]["first", n] += t < n
            counts[cat]["freq", n] += t in top[n]
print("| outputs | tokens | " + " | ".join(f"first {n} | top {n}" for n in sizes) + " |")
for cat, c in sorted(counts.items()):
    cells = " | ".join(f"{c['first', n] / c['n']:.3f} | {c['freq', n] / c['n']:.3f}" for n in sizes)
    print(f"| {cat} | {c['n']} | {cells} |")
