"""verispec bench --costs' measurement alone (the package's measure_costs): the curve, and the step paired with reads."""
from verispec.cli.bench import measure_costs
from verispec.models.load import default_threads, load
from verispec.models.packaged import DEFAULT_TARGET
default_threads()
m = load(DEFAULT_TARGET, dtype="w4a8").model
c = measure_costs(m, progress=False)
print(" ".join(f"{r['tokens']}:{r['ms']}ms({r['relative_to_1']}x)" for r in c["verification_curve"]))
print(c["bandwidth"])
