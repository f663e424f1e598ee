"""One decoding step at a 250-token context: the forward, its compiled layer stack, and the stack's matmuls alone:
python step_split.py d|t.
"""
import time, torch, statistics as st, sys
from verispec.models.load import load, default_threads
from verispec.models.packaged import DEFAULT_DRAFT, DEFAULT_TARGET
from verispec.models.quant import truncate_head
from verispec.models.kernels import w4a8
default_threads()
k = w4a8()
m = load(DEFAULT_DRAFT if sys.argv[1]=="d" else DEFAULT_TARGET, dtype="w4a8-4bit" if sys.argv[1]=="d" else "w4a8", progress=False).model
cache = m.new_cache(2048)
m.forward(torch.randint(0,1000,(1,250)), cache, last_n=1); cache.commit(250)
x1 = torch.tensor([[42]])
# capture the stack call
import verispec.models.llama as L
pos = torch.tensor([250]); key_pos = torch.arange(251)
plan = m.layer_plan(pos, key_pos, None, 1)
xin = m.inputs(x1, None)
def stack():
    t=time.perf_counter(); m.run_layers(xin, cache, plan); return time.perf_counter()-t
def fwd():
    t=time.perf_counter(); m.forward(x1, cache, last_n=1); return time.perf_counter()-t
ops=[b.stack_operands()[0] for b in m.layers]
H=m.cfg.hidden_size; I=m.cfg.intermediate_size; A=m.cfg.num_attention_heads*m.cfg.head_dim
xs=torch.randn(1,H); xa=torch.randn(1,A); xi=torch.randn(1,I); none=torch.empty(0)
def mms():
    t=time.perf_counter()
    for o in ops:
        k.w4a8_mm(xs,o[1],o[2],o[3],o[4]); k.w4a8_mm(xa,o[5],o[6],o[7],none); k.w4a8_mm(xs,o[9],o[10],o[11],none); k.w4a8_mm(xi,o[12],o[13],o[14],none)
    return time.perf_counter()-t
for _ in range(5): stack(); fwd(); mms()
a=[];b=[];c=[]
for _ in range(40): a.append(stack()); b.append(mms()); c.append(fwd())
print(f"{sys.argv[1]}: stack {1e3*st.median(a):.2f} ms, its matmuls alone {1e3*st.median(b):.2f} ms, forward {1e3*st.median(c):.2f} ms")
