"""GB/s of each decoder matmul kind (q/k/v, output, gate/up, down) at one row, weights cold (all layers in turn, another
kind run between repetitions), with 2 threads then 1: python matmul_rates.py d|t (draft or target, as run by default).
"""
import time, torch, statistics as st, os, sys
from verispec.models.load import load, default_threads
from verispec.models.packaged import DEFAULT_DRAFT, DEFAULT_TARGET
from verispec.models.kernels import w4a8
default_threads()
k = w4a8()
model = load(DEFAULT_DRAFT if sys.argv[1]=="d" else DEFAULT_TARGET, dtype=os.environ.get("DT", "w4a8-4bit" if sys.argv[1] == "d" else "w4a8"), progress=False).model
none = torch.empty(0)
H=model.cfg.hidden_size; I=model.cfg.intermediate_size; A=model.cfg.num_attention_heads*model.cfg.head_dim
ops=[b.stack_operands()[0] for b in model.layers]
x=torch.randn(1,H); xa=torch.randn(1,A); xi=torch.randn(1,I)
kinds={"qkv":(1,2,3,4,x),"o":(5,6,7,None,xa),"w13":(9,10,11,None,x),"w2":(12,13,14,None,xi)}
def run(kind):
    a,b,c,d,xx=kinds[kind]
    t=time.perf_counter()
    for o in ops: k.w4a8_mm(xx,o[a],o[b],o[c],o[d] if d else none)
    return time.perf_counter()-t
for thr in (2, 1):
    torch.set_num_threads(thr)
    for kind in kinds:
        a,b,c,d,xx=kinds[kind]
        byt=sum(o[a].numel()+o[b].numel()+o[c].numel()*2 for o in ops)
        for _ in range(3): run(kind); run("w13" if kind!="w13" else "w2")
        ts=[]
        for _ in range(15):
            run("w13" if kind!="w13" else "w2")  # evict
            ts.append(run(kind))
        m=st.median(ts)
        print(f"thr {thr} {kind}: {1e6*m/len(ops):.1f} us/call, {byt/len(ops)/1e3:.0f} KB, {byt/m/1e9:.1f} GB/s")
