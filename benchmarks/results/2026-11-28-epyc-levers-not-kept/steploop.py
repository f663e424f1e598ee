"""Repeated decoding steps of the draft (or target) on a 300-token cache, for perf: python steploop.py d|t SECONDS
(step_parts.py times the parts of the same steps)."""
import sys, time, torch
sys.path.insert(0, str(__import__('pathlib').Path(__file__).resolve().parents[1] / '2026-11-27-epyc-avx512-prefill-share'))
from common import model


def stepping(which: str):
    """The model ("d" or "t"), its cache holding 300 random tokens, and a one-token input (steps commit nothing)."""
    m = model(which)
    cache = m.new_cache(340)
    m.forward(torch.randint(1000, (1, 300)), cache, last_n=1)
    cache.commit(300)
    return m, cache, torch.randint(1000, (1, 1))


if __name__ == "__main__":
    m, cache, x = stepping(sys.argv[1])
    for _ in range(20):
        m.forward(x, cache, last_n=1)
    n, t0 = 0, time.perf_counter()
    ts = []
    while time.perf_counter() - t0 < float(sys.argv[2]):
        t = time.perf_counter(); m.forward(x, cache, last_n=1); ts.append(time.perf_counter() - t); n += 1
    ts.sort()
    print(f"{n} steps, median {ts[len(ts)//2]*1e3:.2f} ms, min {ts[0]*1e3:.2f} ms", file=sys.stderr)
