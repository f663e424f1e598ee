"""A prefill's time against its matmuls alone (same shapes, same kernel, all layers): python prefill_split.py t|d TOKENS.
"""
import time, torch, statistics as st, os, sys
from verispec.models.load import load, default_threads
from verispec.models.packaged import DEFAULT_DRAFT, DEFAULT_TARGET
from verispec.models.kernels import w4a8
default_threads()
k = w4a8()
T = int(sys.argv[2]) if len(sys.argv) > 2 else 300
model = load(DEFAULT_DRAFT if sys.argv[1]=="d" else DEFAULT_TARGET, dtype=os.environ.get("DT", "w4a8-4bit" if sys.argv[1] == "d" else "w4a8"), progress=False).model
none = torch.empty(0)
H=model.cfg.hidden_size; I=model.cfg.intermediate_size; A=model.cfg.num_attention_heads*model.cfg.head_dim
ops=[b.stack_operands()[0] for b in model.layers]
x=torch.randn(T,H); xa=torch.randn(T,A); xi=torch.randn(T,I)
kinds={"qkv":(1,2,3,4,x),"o":(5,6,7,None,xa),"w13":(9,10,11,None,x),"w2":(12,13,14,None,xi)}
tot=0; prods=0
for kind,(a,b,c,d,xx) in kinds.items():
    t=time.perf_counter()
    for o in ops: k.w4a8_mm(xx,o[a],o[b],o[c],o[d] if d is not None else none)
    dt=time.perf_counter()-t; tot+=dt
    p=sum(o[c].shape[0]*16*xx.shape[1] for o in ops)*T
    prods+=p
    print(f"{kind}: {dt*1e3:.1f} ms  {p/dt/1e9:.0f} G products/s  bits {o[a].shape[1]*64*8/(xx.shape[1]*16)}")
print(f"matmuls total {tot*1e3:.0f} ms for {T} tokens: {tot/T*1e3:.2f} ms/token, {prods/tot/1e9:.0f} GOPS")
hd = torch.randn(T, H)
t=time.perf_counter(); model.lm_head(model.norm(hd[-1:][None])); print("head(last) ms", (time.perf_counter()-t)*1e3)
toks=torch.randint(0,1000,(1,T))
for rep in range(2):
    cache=model.new_cache(T+16)
    t=time.perf_counter(); model.forward(toks, cache, last_n=1); dt=time.perf_counter()-t
    print(f"prefill forward {T} tokens: {dt*1e3:.0f} ms")
