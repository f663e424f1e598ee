"""Pinned threads against free ones, interleaved in one process: target step, 5-token verification, draft step,
a 200-token target prefill. Pinned: the main thread on CPU 0, every other thread on CPU 1 (libgomp's one worker
with 2 threads); free: all threads on both CPUs."""
import os, sys, time, statistics, threading, torch
from pathlib import Path
ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / 'benchmarks')); sys.path.insert(0, str(ROOT))
from step_ab import filled_caches
from verispec.models.load import default_threads, load
from verispec.models.packaged import DEFAULT_DRAFT, DEFAULT_TARGET
from verispec.models.kernels import kernel_isa
default_threads()
models = {"target": load(DEFAULT_TARGET, dtype="w4a8").model, "draft": load(DEFAULT_DRAFT, dtype="w4a8-4bit").model}
gen = torch.Generator().manual_seed(0)
caches = filled_caches(models, 300, gen)
main_tid = threading.get_native_id()
cpus = sorted(os.sched_getaffinity(0))
def tids():
    return [int(t) for t in os.listdir('/proc/self/task')]
def setmode(pinned):
    for t in tids():
        try:
            os.sched_setaffinity(t, {cpus[0]} if pinned and t == main_tid else {cpus[1]} if pinned else set(cpus))
        except OSError:
            pass
pre_cache = models["target"].new_cache(260)
cases = [("target", 1), ("target", 5), ("draft", 1), ("prefill", 200)]
times = {(n, k, m): [] for n, k in cases for m in (False, True)}
REPS = int(sys.argv[1]) if len(sys.argv) > 1 else 20
for rep in range(REPS + 2):
    for name, k in cases:
        x = torch.randint(1000, (1, k), generator=gen)
        for mode in ((False, True) if rep % 2 else (True, False)):
            setmode(mode)
            t0 = time.perf_counter()
            if name == "prefill":
                models["target"].forward(x, pre_cache, last_n=1)
            else:
                models[name].forward(x, caches[name], last_n=k)
            dt = time.perf_counter() - t0
            if rep >= 2:
                times[(name, k, mode)].append(dt)
print(f"kernel build {kernel_isa()}, threads {torch.get_num_threads()}, tasks {len(tids())}, reps {REPS}")
for name, k in cases:
    f, p = (1000 * statistics.median(times[(name, k, m)]) for m in (False, True))
    lo_f, lo_p = (1000 * min(times[(name, k, m)]) for m in (False, True))
    print(f"{name:8s} {k:4d}  free {f:8.2f} ms (min {lo_f:.2f})  pinned {p:8.2f} ms (min {lo_p:.2f})  pinned/free {p / f:.3f}")
