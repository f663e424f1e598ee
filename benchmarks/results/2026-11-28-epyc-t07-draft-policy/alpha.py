import torch, collections, sys
data = torch.load("logits.pt")
T = float(sys.argv[1]) if len(sys.argv) > 1 else 0.7
tds = [0.5, 0.6, 0.65, 0.7, 0.75, 0.8, 0.9, 1.0]
res = collections.defaultdict(lambda: collections.defaultdict(list))
for d in data:
    p = torch.softmax(d["lt"].float() / T, -1)
    for td in tds:
        q = torch.softmax(d["ld"].float() / td, -1)
        a = torch.minimum(p[:, :65536], q).sum(-1)
        code = d["cat"].startswith("code")
        res["code" if code else "other"][td].append(a)
        res["all"][td].append(a)
for k, v in res.items():
    print(k, " ".join(f"Td={td}: {torch.cat(v[td]).mean():.4f}" for td in tds))
