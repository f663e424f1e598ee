"""Microseconds of each Python piece of a one-token forward (timeit, 2000 calls): VERISPEC_KERNEL_ISA=avx2 python python_pieces.py d"""
import sys, time, torch, timeit
sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[1] / "2026-11-27-epyc-avx512-prefill-share"))
from common import model
from verispec.batch import make_rows
from verispec.cache import contiguous_plan
from verispec.models.llama import attention
m = model(sys.argv[1])
rows = make_rows(m, 1, 1024, 8)
rows.forward([0], [list(range(100, 300))]); rows.commit(0, 200)
rc = rows.cache.row(0)
start = 200; t = 1
pos = start + torch.arange(t)
tok = torch.tensor([[42]])
x = m.embed(tok)
def T(name, stmt):
    n = 2000
    s = timeit.timeit(stmt, number=n, globals=globals())
    print(f"{name:30s} {s/n*1e6:8.1f} us")
T("torch.tensor chain", "torch.tensor([[42]], dtype=torch.long)")
T("pos", "start + torch.arange(t)")
T("key_pos", "torch.cat([torch.arange(start), pos])")
T("layer_plan", "m.layer_plan(pos, torch.arange(start+t), None, 1)")
T("attention()", "attention(None, 1, torch.float32, m.device, None)")
T("inputs", "m.inputs(tok, None)")
T("contiguous_plan", "contiguous_plan(0, 1, start, t, m.k_device if hasattr(m,'k_device') else torch.device('cpu'))")
T("rowcache.plan", "rc.plan(1, 1)")
T("norm", "m.norm(x)")
T("lm_head", "m.lm_head(x)")
T("run_layers", "m.run_layers(x, rc, m.layer_plan(pos, torch.arange(start+t), None, 1))")
T("model.forward", "m.forward(tok, rc, last_n=1)")
T("rows.forward", "rows.forward([0], [[42]], last_only=True)")
T("m.device", "m.device")
T("m.dtype", "m.dtype")
