import sys, time, torch
from verispec.models import kernels
from verispec.models.quant import W4A8Linear
torch.manual_seed(0)
a = kernels.w4a8(sys.argv[1]); M = int(sys.argv[2])
q = W4A8Linear(torch.nn.Linear(1536, 17920, bias=False), bits=4)
ws = [(q.weight.clone(), q.codes.clone(), q.units.clone()) for _ in range(8)]
x = torch.randn(M, 1536); E = torch.empty(0)
for w, c, u in ws: a.w4a8_mm(x, w, c, u, E)
t = time.perf_counter()
for i in range(int(sys.argv[3])):
    for w, c, u in ws: a.w4a8_mm(x, w, c, u, E)
print(sys.argv[1], M, (time.perf_counter() - t) / int(sys.argv[3]) / 8 * 1e3, "ms per gate/up matmul")
