"""verispec's own CPU kernel (w4a8.cpp), compiled on first use and cached per machine.

PyTorch ships no 4-bit-weight x 8-bit-activation matmul for x86, and that is the kernel a CPU decoding step
needs: it is bound by reading weights, and verification must cost about what a 1-token step costs. The
source is compiled with torch's extension builder (g++, ninja) into the verispec cache, keyed by the source,
torch and Python versions, so it builds once per machine.
"""

from __future__ import annotations

import functools
import hashlib
import os
import sys
from pathlib import Path
from types import ModuleType

import torch

NEEDED_FLAGS = ("avx512f", "avx512bw", "avx512vl", "avx512_vnni")
CFLAGS = ["-O3", "-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512vnni", "-mfma", "-mf16c"]
# fbgemm's u8 x s8 GEMM (w8a8) is exact only with VNNI: its AVX2 and plain AVX-512 paths sum pairs of products
# into saturating int16 (vpmaddubsw), which put rows 17-22% off on an AVX2 machine
W8A8_FLAGS = ("avx512_vnni",)


class KernelError(RuntimeError):
    pass


@functools.cache
def cpu_flags() -> frozenset[str]:
    """The CPU's feature flags from /proc/cpuinfo (empty where there is none)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


def missing_cpu_flags() -> list[str]:
    flags = cpu_flags()
    return [f for f in NEEDED_FLAGS if f not in flags]


def w8a8_refusal() -> str | None:
    """Why `--dtype w8a8` would give wrong results on this CPU, as one line; None where it is exact."""
    missing = [f for f in W8A8_FLAGS if f not in cpu_flags()]
    if not missing:
        return None
    return (f"w8a8 needs a CPU with AVX-512 VNNI; this one lacks {', '.join(missing)}, and there PyTorch's int8 "
            "kernel (fbgemm) saturates int16 sums and puts outputs ~20% off: use --dtype w4a8, int8 or bfloat16")


@functools.cache
def w4a8() -> ModuleType:
    """The compiled kernel module (`w4a8_mm`); raises KernelError with what to do instead when it can't be."""
    missing = missing_cpu_flags()
    if missing:
        raise KernelError(f"w4a8 needs a CPU with AVX-512 VNNI; this one lacks {', '.join(missing)}: "
                          "use --dtype w8a8, int8 or bfloat16")
    from torch.utils import cpp_extension

    from verispec.models.packaged import cache_dir

    src = Path(__file__).with_name("w4a8.cpp")
    key = hashlib.sha256(src.read_bytes() + " ".join([torch.__version__, sys.version, *CFLAGS]).encode()).hexdigest()[:16]
    build = cache_dir() / "kernels" / f"w4a8-{key}"
    build.mkdir(parents=True, exist_ok=True)
    try:  # the `ninja` wheel puts its binary beside the interpreter, which is not on PATH unless the venv is active
        import ninja

        os.environ["PATH"] = ninja.BIN_DIR + os.pathsep + os.environ.get("PATH", "")
    except ImportError:
        pass
    if not any(build.glob("*.so")):
        print("compiling verispec's w4a8 CPU kernel (once per machine, about 20 s)...", file=sys.stderr)
    try:
        return cpp_extension.load(name=f"verispec_w4a8_{key}", sources=[str(src)], extra_cflags=CFLAGS,
                                  build_directory=str(build), verbose=False)
    except (RuntimeError, OSError, ImportError) as e:  # no compiler, no ninja, a failed build
        raise KernelError(f"cannot build the w4a8 kernel in {build} ({e}); it needs g++ and ninja "
                          "(pip install ninja): use --dtype w8a8, int8 or bfloat16 meanwhile") from e
