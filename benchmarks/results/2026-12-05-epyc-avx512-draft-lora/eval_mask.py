"""Held-out agreement of the draft with and without the adapter, split into prompt and answer positions."""
import sys, torch, torch.nn.functional as F, glob
from safetensors import safe_open
from transformers import Qwen2ForCausalLM
sys.argv += []
exec(open('/tmp/distill/probe.py').read().split("model = Qwen2ForCausalLM")[0].split("RANK, LR, BUDGET")[0])
f = safe_open(TGT, 'pt'); t_norm = f.get_tensor('model.norm.weight').float(); t_head = f.get_tensor('lm_head.weight')
def target_logits(feat):
    x = feat.float(); x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * t_norm
    return (x.bfloat16() @ t_head.T).float()
def answer_mask(tok):  # 1 where the token is inside an assistant turn (predicting its next token), -1 unknown, 0 prompt
    m = torch.full(tok.shape, -1)
    for r in range(tok.shape[0]):
        state = -1
        for i in range(tok.shape[1]):
            if i >= 2 and tok[r, i-2] == 151644 and tok[r, i-1] == 77091 and tok[r, i] == 198: state = 1
            elif tok[r, i] == 151644: state = 0
            elif tok[r, i] == 151645: state = 0
            m[r, i] = state
    return m
for name, path in (('base', DRAFT), ('adapted', sys.argv[1])):
    model = Qwen2ForCausalLM.from_pretrained(path, torch_dtype=torch.bfloat16).eval()
    s = {0: [0, 0], 1: [0, 0]}
    with torch.no_grad():
        for p in eval_sh[:2]:
            g = safe_open(p, 'pt'); tok = g.get_tensor('tokens').long(); feat = g.get_tensor('features')
            m = answer_mask(tok)
            for i in range(0, 16, 4):
                with torch.autocast('cpu', dtype=torch.bfloat16):
                    q = model(tok[i:i+4]).logits.float()
                pt = target_logits(feat[i:i+4].reshape(-1, 1536)).view(4, 256, -1)
                hit = q.argmax(-1) == pt.argmax(-1)
                for k in (0, 1):
                    sel = m[i:i+4] == k
                    s[k][0] += hit[sel].sum().item(); s[k][1] += sel.sum().item()
    print(name, 'prompt positions %.3f (%d)' % (s[0][0] / s[0][1], s[0][1]), 'answer positions %.3f (%d)' % (s[1][0] / s[1][1], s[1][1]), flush=True)
