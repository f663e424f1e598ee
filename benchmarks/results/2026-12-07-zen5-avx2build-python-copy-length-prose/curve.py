"""The verification-cost curve of this VM (sizes interleaved): VERISPEC_KERNEL_ISA=avx2 python curve.py"""
import torch, sys
from verispec.bench.costs import verification_curve
from verispec.models.load import default_threads, load
from verispec.models.packaged import DEFAULT_TARGET
default_threads()
t = load(DEFAULT_TARGET, dtype="w4a8")
for rep in range(2):
    print(verification_curve(t.model, context=300, sizes=(1, 2, 3, 5, 9), reps=9))
