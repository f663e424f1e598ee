"""The control arm's features: the last block's output alone (the last H columns) of refeature.py's shards, so that
both drafters train on the very same forwards.

    python last_only.py FEATURES3_DIR OUT_DIR
"""

import sys
from pathlib import Path

from safetensors.torch import load_file, save_file

src, out = Path(sys.argv[1]), Path(sys.argv[2])
out.mkdir(parents=True, exist_ok=True)
for path in sorted(src.glob("shard-*.safetensors")):
    shard = load_file(str(path))
    h = shard["features"].shape[-1] // 3
    save_file({"tokens": shard["tokens"], "features": shard["features"][..., -h:].contiguous()}, str(out / path.name))
