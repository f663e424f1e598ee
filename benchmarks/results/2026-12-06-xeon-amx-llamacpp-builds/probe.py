"""llama.cpp's plain decoding with its AMX weight repacking on (default) or off, one process per setting:
prefill of a ~500-token prompt and a 64-token greedy decode, timed."""
import sys, time
import llama_cpp
import llama_cpp.llama_cpp as lib
repack = sys.argv[1] == "on"
defaults = lib.llama_model_default_params
def params():
    p = defaults(); p.use_extra_bufts = repack; return p
lib.llama_model_default_params = params
print(lib.llama_print_system_info().decode().strip(), flush=True)
llm = llama_cpp.Llama(model_path="/root/.cache/verispec/gguf/qwen2.5-coder-1.5b-instruct.gguf", n_ctx=2048,
                      n_threads=2, n_threads_batch=2, verbose=False)
lib.llama_model_default_params = defaults
text = open("/work/main/verispec/engine.py").read()[:2000]
toks = llm.tokenize(text.encode())[:500]
for rep in range(2):
    llm.reset()
    t0 = time.perf_counter(); llm.eval(toks); t1 = time.perf_counter()
    out = []
    for _ in range(64):
        tok = llm.sample(temp=0.0); out.append(tok); llm.eval([tok])
    t2 = time.perf_counter()
    print(f"repack {sys.argv[1]} rep {rep}: prefill {len(toks)} tokens {t1-t0:.2f} s ({len(toks)/(t1-t0):.0f} tok/s), "
          f"decode 64 tokens {(t2-t1)/64*1e3:.1f} ms a token; first ids {out[:5]}", flush=True)
