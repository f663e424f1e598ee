"""OpenVINO GenAI's first token on ~500-token prompts, its default precision against f32, alternated."""
import json, sys, time
import numpy as np, openvino as ov, openvino_genai as g
from verispec.models.files import cache_dir
tgt = str(cache_dir() / "openvino" / "qwen2.5-coder-1.5b-instruct-int4")
core = ov.Core()
print("CPU OPTIMIZATION_CAPABILITIES", core.get_property("CPU", "OPTIMIZATION_CAPABILITIES"))
print("CPU INFERENCE_PRECISION_HINT default", core.get_property("CPU", "INFERENCE_PRECISION_HINT"))
prompts = [json.loads(l) for l in open(sys.argv[1])]
pipes = {}
for name, extra in (("default", {}), ("f32", {"INFERENCE_PRECISION_HINT": "f32"})):
    pipes[name] = g.LLMPipeline(tgt, "CPU", INFERENCE_NUM_THREADS=2, scheduler_config=g.SchedulerConfig(), **extra)
tok = pipes["default"].get_tokenizer()
res = {k: [] for k in pipes}
for rep in range(2):
    for p in prompts:
        for name in (["default", "f32"] if rep % 2 == 0 else ["f32", "default"]):
            pipe = pipes[name]
            enc = tok.encode(p["prompt"])
            n = enc.input_ids.get_shape()[1]
            cfg = pipe.get_generation_config(); cfg.max_new_tokens = 1
            t0 = time.perf_counter(); pipe.generate(enc, cfg); dt = time.perf_counter() - t0
            res[name].append(dt)
            print(name, p.get("id"), n, "tokens", "%.3f s" % dt, flush=True)
for k, v in res.items():
    print(k, "median %.3f s" % float(np.median(v)), "range %.3f-%.3f" % (min(v), max(v)))
