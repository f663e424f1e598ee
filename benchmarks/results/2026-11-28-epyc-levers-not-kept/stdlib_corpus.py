"""Tokenize the Python standard library's own source into one int32 array, files separated by -1 (the corpus of a
lookup drafter checked offline by corpus_lookup_sim.py): python stdlib_corpus.py TOKENIZER_DIR [OUT.npy]."""
import sys, glob, os, time, numpy as np, sysconfig
from tokenizers import Tokenizer
tok = Tokenizer.from_file(os.path.join(sys.argv[1], 'tokenizer.json'))
root = sysconfig.get_paths()['stdlib']
files = [f for f in glob.glob(root + '/**/*.py', recursive=True) if '/site-packages/' not in f and '/test' not in f and '/idlelib/' not in f]
t=time.time(); texts=[]
for f in files:
    try: texts.append(open(f, encoding='utf-8').read())
    except Exception: pass
print(len(files), sum(map(len,texts)))
enc = tok.encode_batch(texts, add_special_tokens=False)
SEP = -1
arr = np.concatenate([np.append(np.array(e.ids, dtype=np.int32), SEP) for e in enc])
print(arr.size, time.time()-t)
np.save(sys.argv[2] if len(sys.argv) > 2 else 'stdlib.npy', arr)
