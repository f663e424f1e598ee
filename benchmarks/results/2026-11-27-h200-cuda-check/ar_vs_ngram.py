"""Why did `ar` take ~3x `ngram`'s time a token on the H200 (both plain steps)? Time both through the bench's
backend, alternating, then profile 24 tokens of each."""
import sys, time
import torch
from verispec.bench.runner import Config, VerispecBackend
from verispec.models.load import load

target = load(sys.argv[1], dtype="bfloat16", device=sys.argv[2] if len(sys.argv) > 2 else "cuda", progress=False)
backend = VerispecBackend(target, None, [])
gen = torch.Generator().manual_seed(0)
prompt = torch.randint(1000, 20000, (200,), generator=gen).tolist()
configs = {s: Config("verispec", s, 0 if s == "ar" else 4, 0.0) for s in ("ar", "ngram")}
for c in configs.values():
    backend.run(c, prompt, 8, 0)
for rep in range(2):
    for s, c in (configs.items() if rep == 0 else reversed(configs.items())):
        r = backend.run(c, prompt, 64, 0)
        print(f"{s}: {1000 * r.seconds / len(r.token_ids):.2f} ms a token, {r.rounds} rounds, "
              f"ttft {1000 * r.arrivals[0][0]:.1f} ms", flush=True)
from torch.profiler import ProfilerActivity, profile
for s, c in configs.items():
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        backend.run(c, prompt, 24, 0)
    print(f"--- {s}")
    print(prof.key_averages().table(sort_by="cpu_time_total", row_limit=14, max_name_column_width=50), flush=True)
