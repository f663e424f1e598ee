"""Where verispec keeps files, and how it checks them: the cache root, a file's sha256, the GGUF magic.

Shared by packaged.py (assembling the packaged pair) and gguf_convert.py (converting any GGUF), so that
neither imports the other's module for them.
"""

from __future__ import annotations

import hashlib
import os
import sys
from pathlib import Path

__all__ = ["GGUF_MAGIC", "CHUNK", "cache_dir", "file_sha256"]

GGUF_MAGIC = b"GGUF"
CHUNK = 8 << 20  # copy/hash in 8 MiB pieces: fast, and memory stays flat


def cache_dir() -> Path:
    """Root of everything verispec caches: `$VERISPEC_CACHE`, else the platform's user cache directory."""
    env = os.environ.get("VERISPEC_CACHE")
    if env:
        return Path(env).expanduser()
    import platformdirs

    return Path(platformdirs.user_cache_dir("verispec"))


def file_sha256(path: Path, progress: bool, desc: str) -> str:
    """Hex sha256 of a file, read in pieces so memory stays flat, with an optional progress bar."""
    from tqdm import tqdm

    h = hashlib.sha256()
    with open(path, "rb") as f, tqdm(
        total=path.stat().st_size, unit="B", unit_scale=True, desc=desc, disable=not progress, file=sys.stderr
    ) as bar:
        while chunk := f.read(CHUNK):
            h.update(chunk)
            bar.update(len(chunk))
    return h.hexdigest()


_SAFETENSORS_DTYPES = {"F32": "float32", "F16": "float16", "BF16": "bfloat16", "U8": "uint8", "I8": "int8",
                       "I16": "int16", "I32": "int32", "I64": "int64", "BOOL": "bool", "F64": "float64"}


def read_safetensors(path: Path) -> dict:
    """A .safetensors file's tensors, each read into its own (aligned) allocation with plain reads.

    safetensors' load_file maps the file and the kernels then need aligned copies: the mapped pages and the
    copies together made a quantized model's load peak at ~2x its size. Here the peak is the tensors alone."""
    import json

    import torch

    out = {}
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(n))
        base = 8 + n
        for name, meta in header.items():
            if name == "__metadata__":
                continue
            start, end = meta["data_offsets"]
            t = torch.empty(meta["shape"], dtype=getattr(torch, _SAFETENSORS_DTYPES[meta["dtype"]]))
            if end > start:
                f.seek(base + start)
                view = memoryview(t.view(-1).view(torch.uint8).numpy())
                if f.readinto(view) != end - start:
                    raise OSError(f"{path}: truncated tensor {name}")
            out[name] = t
    return out
