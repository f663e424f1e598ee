"""Replay drafting chains over collect.py's logits and price them (tokens per one-token target step).

    python sim.py single 3,4,6 0,0.2,0.3,0.4,0.5,0.6,0.7   # stop after a drafted token with q(x) < θ
    python sim.py prod 6,8 0.1,0.2,0.3,0.4,0.5             # stop once the product of the drafted q(x) < θ
    python sim.py single 6,8 0.5,0.7
"""
import sys
import torch, collections
from verispec.theory import interpolate_cost
from verispec.defaults import default_verify_cost
cost = interpolate_cost(default_verify_cost("cpu", kernel_isa="avx512"))
data = torch.load("logits.pt")
T, c = 0.7, 0.29
g = torch.Generator().manual_seed(0)
groups = collections.defaultdict(list)
for d in data:
    p = torch.softmax(d["lt"].float() / T, -1)[:, :65536]
    q = torch.softmax(d["ld"].float() / T, -1)
    groups["code" if d["cat"].startswith("code") else "prose"].append((p, q))
def sim(pairs, gamma, theta, reps=4):
    tok = tim = 0.0
    for p, q in pairs:
        n = p.shape[0]
        for _ in range(reps):
            # per position: a draw x ~ q, accept?, confident?
            x = torch.multinomial(q, 1, generator=g)[:, 0]
            qx = q[torch.arange(n), x]; px = p[torch.arange(n), x]
            acc = (torch.rand(n, generator=g) * qx < px).tolist(); conf = (qx >= theta).tolist(); ql = qx.tolist()
            for j in range(0, n - gamma - 1):
                drafted = 0
                prod = 1.0
                for k in range(gamma):
                    drafted += 1
                    prod *= ql[j + k] if MODE == "prod" else 1.0
                    if MODE == "prod" and prod < theta: break
                    if MODE == "single" and not conf[j + k]: break
                accepted = 0
                for k in range(drafted):
                    if not acc[j + k]: break
                    accepted += 1
                tok += accepted + 1; tim += drafted * c + cost(drafted + 1)
    return tok / tim
MODE = sys.argv[1]
gammas = [int(x) for x in sys.argv[2].split(",")]
thetas = [float(x) for x in sys.argv[3].split(",")]
for name, pairs in groups.items():
    for gamma in gammas:
        print(name, "gamma", gamma, " ".join(f"θ={th}: {sim(pairs, gamma, th):.3f}" for th in thetas))
