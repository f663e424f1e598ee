import time, torch, sys
from verispec.models import kernels
from verispec.models.quant import W4A8Linear
torch.manual_seed(0)
a = kernels.w4a8("amx"); v = kernels.w4a8("avx512")
print(a.isa(), v.isa())
for bits in (3, 4, 6, 8):
    for n, k in ((80, 640), (48, 256), (256, 1536), (32, 800), (16, 96)):
        q = W4A8Linear(torch.nn.Linear(k, n, bias=True), bits=bits)
        bias = q.bias if q.bias is not None else torch.empty(0)
        for rows in list(range(1, 21)) + [31, 32, 33, 47, 100]:
            x = torch.randn(rows, k) * torch.logspace(-2, 2, rows)[:, None]
            ya = a.w4a8_mm(x, q.weight, q.codes, q.units, bias); yv = v.w4a8_mm(x, q.weight, q.codes, q.units, bias)
            if not torch.equal(ya, yv):
                print("DIFF", bits, n, k, rows, (ya - yv).abs().max()); sys.exit(1)
print("bit-identical")
