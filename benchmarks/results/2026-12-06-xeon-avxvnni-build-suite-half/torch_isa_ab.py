"""Median ms of the w4a8 target's decoding step and a 5-token verification, and the draft's step, in this process's ISA settings."""
import json, os, sys, torch
from verispec.models.load import load
from verispec.bench.costs import verification_curve
from verispec.models import kernels
tag = sys.argv[1]
t = load("qwen2.5-coder-1.5b-instruct", dtype="w4a8", progress=False)
d = load("qwen2.5-coder-0.5b-instruct", dtype="w4a8-4bit", progress=False)
ct = verification_curve(t.model, sizes=(1, 5), reps=15)
cd = verification_curve(d.model, sizes=(1,), reps=15)
print(json.dumps({"tag": tag, "cap": torch.backends.cpu.get_cpu_capability(), "target": ct, "draft": cd}))
