import sys, shutil, torch
from pathlib import Path
from safetensors.torch import load_file, save_file
src = Path('/root/.cache/verispec/converted/1d9614638d18024d-bfloat16'); out = Path(sys.argv[2])
lora = torch.load(sys.argv[1])
out.mkdir(parents=True, exist_ok=True)
for f in src.iterdir():
    if f.is_file() and not f.name.startswith('verispec') and f.name != 'model.safetensors':
        shutil.copy(f, out / f.name)
w = load_file(str(src / 'model.safetensors'))
n = 0
for k in lora:
    if not k.endswith('.a'): continue
    base = k[:-2]  # model.layers.N.self_attn.q_proj
    name = base + '.weight'
    delta = lora[base + '.b'].float() @ lora[k].float()
    rel = delta.norm() / w[name].float().norm()
    w[name] = (w[name].float() + delta).to(torch.bfloat16); n += 1
print('merged', n, 'last rel', float(rel))
save_file(w, str(out / 'model.safetensors'), metadata={'format': 'pt'})
