"""Held-out agreement of an EAGLE drafter at each draft step (the true tokens fed, each step reading the drafter's
own previous prediction): verispec.train_drafter.step_agreements over cached feature shards.

    python depth_agree.py DRAFTER_DIR FEATURES_DIR SHARDS DEPTH     e.g. ... ~/.cache/verispec/drafters/eagle-ttt \
        ~/.cache/verispec/drafters/eagle-answers/features 127 4
"""
import sys
import time
from pathlib import Path

import torch
from safetensors.torch import load_file

from verispec.models.eagle import load_drafter
from verispec.models.load import default_threads, load
from verispec.models.packaged import DEFAULT_TARGET
from verispec.train_drafter import step_agreements

default_threads()
d, feats, shards, depth = Path(sys.argv[1]).expanduser(), Path(sys.argv[2]).expanduser(), sys.argv[3], int(sys.argv[4])
drafter = load_drafter(d, load(DEFAULT_TARGET, dtype="w4a8", progress=False).model)
sums, batches, t0 = [0.0] * depth, 0, time.time()
for s in shards.split(","):
    data = load_file(str(feats / f"shard-{int(s):05d}.safetensors"))
    for i in range(0, data["tokens"].shape[0], 4):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            a = step_agreements(drafter, data["tokens"][i : i + 4], data["features"][i : i + 4], depth)
        sums, batches = [x + y for x, y in zip(sums, a)], batches + 1
print(d.name, "shards", shards, "agreement by step:", " ".join(f"{x / batches:.3f}" for x in sums),
      f"({time.time() - t0:.0f} s)")
