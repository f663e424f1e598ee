import sys, torch
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "2026-11-27-epyc-avx512-prefill-share"))
from common import model
from verispec.bench.costs import bandwidth_limit, decoding_step
m = model("t")
with torch.inference_mode():
    for ctx in (512, 250, 512, 250):
        step = decoding_step(m, context=ctx)
        print(ctx, bandwidth_limit(m, step=step, reps=9))
