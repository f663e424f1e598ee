"""Probe: does a LoRA distillation of the 0.5B draft on the target's own answers raise its agreement with the target?"""
import math, sys, time, glob
import torch, torch.nn as nn, torch.nn.functional as F
from safetensors import safe_open
from transformers import Qwen2ForCausalLM

torch.manual_seed(0)
DRAFT = '/root/.cache/verispec/converted/1d9614638d18024d-bfloat16'
TGT = '/root/.cache/verispec/converted/cc324af070c2ecbf-bfloat16/model.safetensors'
shards = sorted(glob.glob('/tmp/eagle/gen/features/shard-*.safetensors'))
train_sh, eval_sh = shards[:-4], shards[-4:]
RANK, LR, BUDGET = int(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3]) * 60
B = 4

f = safe_open(TGT, 'pt')
t_norm = f.get_tensor('model.norm.weight').float()
t_head = f.get_tensor('lm_head.weight')  # bf16 [V, 1536]

def target_logits(feat):  # [N, 1536] bf16 -> [N, V] float
    x = feat.float()
    x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * t_norm
    return (x.bfloat16() @ t_head.T).float()

model = Qwen2ForCausalLM.from_pretrained(DRAFT, torch_dtype=torch.bfloat16)
model.requires_grad_(False)

class LoRA(nn.Module):
    def __init__(self, base, r):
        super().__init__()
        self.base = base
        self.a = nn.Parameter(torch.randn(r, base.in_features) / math.sqrt(base.in_features))
        self.b = nn.Parameter(torch.zeros(base.out_features, r))
    def forward(self, x):
        return self.base(x) + (x.to(self.a.dtype) @ self.a.T @ self.b.T).to(x.dtype)

params = []
if RANK > 0:
    for layer in model.model.layers:
        for parent, names in ((layer.self_attn, 'q_proj k_proj v_proj o_proj'), (layer.mlp, 'gate_proj up_proj down_proj')):
            for n in names.split():
                m = LoRA(getattr(parent, n), RANK); setattr(parent, n, m); params += [m.a, m.b]
opt = torch.optim.AdamW(params, lr=LR, weight_decay=0.0) if params else None

def load(path):
    g = safe_open(path, 'pt')
    return g.get_tensor('tokens').long(), g.get_tensor('features')

@torch.no_grad()
def evaluate():
    model.eval()
    agree = n = 0; acc07 = 0.0; agree_late = n_late = 0
    for path in eval_sh[:2]:
        tok, feat = load(path)
        for i in range(0, tok.shape[0], B):
            t, ft = tok[i:i+B], feat[i:i+B]
            with torch.autocast('cpu', dtype=torch.bfloat16):
                q = model(t).logits.float()
            p = target_logits(ft.reshape(-1, ft.shape[-1])).view(*t.shape, -1)
            hit = (q.argmax(-1) == p.argmax(-1))
            agree += hit.sum().item(); n += hit.numel()
            agree_late += hit[:, 128:].sum().item(); n_late += hit[:, 128:].numel()
            acc07 += torch.minimum(F.softmax(p / 0.7, -1), F.softmax(q / 0.7, -1)).sum(-1).sum().item()
    model.train()
    return agree / n, agree_late / n_late, acc07 / n

t0 = time.time()
print(f'rank {RANK} lr {LR}: before: argmax agreement, after 128 tokens, T=0.7 acceptance = {evaluate()} ({time.time()-t0:.0f}s)', flush=True)
if opt is None: sys.exit()
start = time.time(); step = 0; seen = 0
order = [(s, i) for s in train_sh for i in range(0, 16, B)]
import random; random.Random(0).shuffle(order)
while time.time() - start < BUDGET and step < len(order):
    s, i = order[step]
    tok, feat = load(s); t, ft = tok[i:i+B], feat[i:i+B]
    with torch.no_grad():
        p = target_logits(ft.reshape(-1, ft.shape[-1]))
        top_lp, top_id = F.log_softmax(p, -1).topk(32, -1)
    with torch.autocast('cpu', dtype=torch.bfloat16):
        q = model(t).logits
    lq = F.log_softmax(q.float().view(-1, q.shape[-1]), -1)
    loss = -(top_lp.exp() * lq.gather(-1, top_id)).sum(-1).mean()
    loss.backward(); opt.step(); opt.zero_grad()
    step += 1; seen += t.numel()
    if step % 10 == 0:
        print(f'step {step} {time.time()-start:.0f}s loss {loss.item():.3f} tokens {seen}', flush=True)
print(f'after {step} steps, {seen} tokens, {(time.time()-start)/60:.1f} min: {evaluate()}', flush=True)
torch.save({k: v for k, v in model.state_dict().items() if k.endswith('.a') or k.endswith('.b')}, f'/tmp/distill/lora-r{RANK}.pt')
