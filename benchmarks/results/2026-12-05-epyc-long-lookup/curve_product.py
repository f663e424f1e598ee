from verispec.bench.costs import verification_curve, bandwidth_limit
from verispec.models.load import default_threads, load
from verispec.models.packaged import DEFAULT_TARGET
default_threads()
m = load(DEFAULT_TARGET, dtype="w4a8").model
c = verification_curve(m, context=512, reps=5)
print(" ".join(f"{r['tokens']}:{r['ms']}ms({r['relative_to_1']}x)" for r in c))
print(bandwidth_limit(m, step_ms=c[0]["ms"]))
