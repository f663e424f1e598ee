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


ALIGN = 64  # the kernels' vector loads want 64-byte aligned operands (what torch.empty gives)


def read_safetensors(path: Path) -> dict:
    """A .safetensors file's tensors, mapped copy-on-write: a tensor whose bytes lie
    64-byte aligned in the file (every one, in files from write_safetensors) is a view of the page cache, no
    copy; any other is copied into its own aligned allocation. Peak memory is the tensors alone (safetensors'
    load_file followed by aligned clones peaked at ~2x), and a warm start reads 1.5 GB in ~0.1 s, not ~1 s."""
    import json
    import mmap

    import torch

    out = {}
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(n))
        size = os.fstat(f.fileno()).st_size
        # private and writable, so tensors are writable (no write ever reaches the file); not MAP_POPULATE,
        # which on a private mapping copies every page (0.6 s for 1.5 GB, where read faults cost 0.07 s)
        mapped = mmap.mmap(f.fileno(), 0, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ | mmap.PROT_WRITE) \
            if size else None
    base = 8 + n
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        start, end = meta["data_offsets"]
        dtype = getattr(torch, _SAFETENSORS_DTYPES[meta["dtype"]])
        if base + end > size:
            raise OSError(f"{path}: truncated tensor {name}")
        if end == start:
            t = torch.empty(meta["shape"], dtype=dtype)
        else:
            t = torch.frombuffer(mapped, dtype=torch.uint8, offset=base + start, count=end - start)
            if t.data_ptr() % ALIGN:
                t = t.clone()  # clone allocates aligned
            t = t.view(dtype).reshape(meta["shape"])
        out[name] = t
    return out


def aligned_safetensors(path: Path) -> bool:
    """Whether every tensor of the file starts 64-byte aligned (read_safetensors then copies nothing)."""
    import json

    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(n))
    return all((8 + n + m["data_offsets"][0]) % ALIGN == 0 for k, m in header.items() if k != "__metadata__")


def write_safetensors(path: Path, tensors: dict) -> None:
    """Write a .safetensors file (the format has no gaps between tensors) whose tensors start 64-byte aligned
    where their sizes allow: the header is padded with spaces so the data starts aligned, and tensors whose
    sizes are multiples of 64 bytes come first."""
    import json
    import struct

    import torch

    tensors = {k: v.contiguous() for k, v in tensors.items()}
    nbytes = {k: v.numel() * v.element_size() for k, v in tensors.items()}
    order = sorted(tensors, key=lambda k: nbytes[k] % ALIGN != 0)  # stable: the rest keep their order
    names = {v: k for k, v in _SAFETENSORS_DTYPES.items()}
    header: dict = {"__metadata__": {"format": "pt"}}
    offset = 0
    for k in order:
        header[k] = {"dtype": names[str(tensors[k].dtype).removeprefix("torch.")], "shape": list(tensors[k].shape),
                     "data_offsets": [offset, offset + nbytes[k]]}
        offset += nbytes[k]
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-(8 + len(blob)) % ALIGN)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(blob)))
        f.write(blob)
        for k in order:
            if nbytes[k]:
                f.write(tensors[k].reshape(-1).view(torch.uint8).numpy().data)


DRAFTER_CONFIG, DRAFTER_WEIGHTS = "config.json", "model.safetensors"  # a drafter directory's two files


def default_drafter_dir(target: str, kind: str) -> Path:
    """Where `train-drafter` puts a `kind` drafter for `target` (as given to --target) when no --out says, and where
    the commands look for one when no --drafter says (cli.options.find_drafters)."""
    return cache_dir() / "drafters" / f"{target}-{kind}"


def trained_drafters(target: str) -> list[str]:
    """The drafter directories at their default places for `target` that hold weights (a run cut off after its first
    checkpoint counts: any drafter is exact, a weak one only slower)."""
    found = [default_drafter_dir(target, kind) for kind in ("eagle", "medusa")]
    return [str(d) for d in found if (d / DRAFTER_CONFIG).is_file() and (d / DRAFTER_WEIGHTS).is_file()]


def save_drafter(directory: Path, weights: dict, config: dict) -> None:
    """A drafter directory (EAGLE, Medusa): its weights (written atomically) and config."""
    import json

    directory.mkdir(parents=True, exist_ok=True)
    tmp = directory / (DRAFTER_WEIGHTS + ".tmp")
    write_safetensors(tmp, {k: v.detach().cpu() for k, v in weights.items()})  # from any device
    tmp.replace(directory / DRAFTER_WEIGHTS)
    (directory / DRAFTER_CONFIG).write_text(json.dumps(config, indent=2) + "\n")


def drafter_config(directory: Path, kind: str, what: str) -> dict:
    """A drafter directory's config.json, checked to be of `kind` (ModelError naming `what` it should hold)."""
    import json

    from verispec.models.errors import ModelError

    try:
        raw = json.loads((directory / DRAFTER_CONFIG).read_text())
    except (OSError, ValueError) as e:
        raise ModelError(f"{directory} is not {what} directory (config.json: {e})") from None
    if not isinstance(raw, dict):
        raise ModelError(f"{directory} is not {what} directory (config.json is not an object)")
    if raw.get("kind", kind) != kind:
        raise ModelError(f"{directory} holds a {raw['kind']!r} drafter, not {what}")
    return raw
