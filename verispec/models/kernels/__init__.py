"""verispec's own CPU kernels (w4a8.cpp: the quantized matmul; attention.cpp: attention over a float32 KV cache;
layer.cpp: a w4a8 decoder layer's work around attention; sample.cpp: a sampled round's softmax and draws), compiled
on first use and cached per machine.

PyTorch ships no 4-bit-weight x 8-bit-activation matmul for x86, and that is the kernel a CPU decoding step
needs: it is bound by reading weights, and verification must cost about what a 1-token step costs. The
source is compiled with torch's extension builder (g++, ninja) into the verispec cache, keyed by the source,
the instruction set, torch and Python versions, so it builds once per machine.

It has three builds, the best the CPU's flags allow picked: AVX-512 VNNI; AVX-VNNI (AVX2 with the 256-bit dot
product instruction: Intel's client cores since Alder Lake); AVX2 + FMA + F16C (most other x86 CPUs
without AVX-512: AMD Zen 2/3, Intel's consumer chips before Alder Lake). Their outputs are bit-identical.
`VERISPEC_KERNEL_ISA=avx2` (or `avxvnni`) forces a lesser build where a better one would run, so each can be tested
and timed on an AVX-512 machine; the AVX-VNNI build runs there as the EVEX form of the same instruction.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import os
import platform
import sys
from pathlib import Path
from types import ModuleType

import torch

ISA_ENV = "VERISPEC_KERNEL_ISA"
# best first; an AVX2 machine never compiles (or runs) the AVX-512 build
ISA_FLAGS = {
    "avx512": ("avx512f", "avx512bw", "avx512vl", "avx512_vnni", "fma", "f16c"),
    "avxvnni": ("avx2", "fma", "f16c", "avx_vnni"),
    "avx2": ("avx2", "fma", "f16c"),
}
# A CPU with AVX-512 VNNI but not AVX-VNNI (AMD Zen 4) runs the AVX-VNNI build's 256-bit code with the EVEX form of
# its instruction (the same operation): the build's stand-in there, so that it is tested and timed on such machines.
EVEX_VNNI_FLAGS = ("avx2", "fma", "f16c", "avx512vl", "avx512_vnni")
# -fopenmp: at::parallel_for is inlined from ATen's headers as an OpenMP loop; compiled without it, the pragma is
# dropped and the kernel runs on one thread (measured: 1 and 2 threads equally fast until it was added).
# -ffp-contract=off: attention.cpp's plain C++ must round the same in both builds (no fused multiply-adds added).
ISA_CFLAGS = {
    "avx512": ["-O3", "-fopenmp", "-ffp-contract=off", "-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512vnni", "-mfma", "-mf16c"],
    "avxvnni": ["-O3", "-fopenmp", "-ffp-contract=off", "-mavx2", "-mfma", "-mf16c", "-mavxvnni"],
    "avx2": ["-O3", "-fopenmp", "-ffp-contract=off", "-mavx2", "-mfma", "-mf16c"],
}
EVEX_VNNI_CFLAGS = ["-O3", "-fopenmp", "-ffp-contract=off", "-mavx2", "-mfma", "-mf16c", "-mavx512vl", "-mavx512vnni",
                    "-DVERISPEC_YMM", "-mprefer-vector-width=256"]  # 256-bit code (vec.h, w4a8.cpp, GCC's own loops)
LDFLAGS = ["-fopenmp"]
SOURCES = ("w4a8.cpp", "attention.cpp", "layer.cpp", "sample.cpp")
HEADERS = ("vec.h", "tensor.h", "ops.h")
ISAS = tuple(ISA_FLAGS)
NEEDED_FLAGS = ISA_FLAGS["avx512"]  # the fastest build's
CFLAGS = ISA_CFLAGS["avx512"]
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


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo (platform.processor() where there is none): for measurement records."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def _evex_vnni() -> bool:
    """Whether the AVX-VNNI build runs as its EVEX stand-in here (AVX-512 VNNI, no AVX-VNNI)."""
    flags = cpu_flags()
    return "avx_vnni" not in flags and all(f in flags for f in EVEX_VNNI_FLAGS)


def missing_cpu_flags(isa: str = "avx512") -> list[str]:
    flags = cpu_flags()
    return [] if isa == "avxvnni" and _evex_vnni() else [f for f in ISA_FLAGS[isa] if f not in flags]


def isa_cflags(isa: str) -> list[str]:
    """The compiler flags of a build on this CPU."""
    return EVEX_VNNI_CFLAGS if isa == "avxvnni" and _evex_vnni() else ISA_CFLAGS[isa]


def available_isas() -> list[str]:
    """The kernel builds this CPU can run, best first."""
    return [isa for isa in ISAS if not missing_cpu_flags(isa)]


def w8a8_refusal() -> str | None:
    """Why `--dtype w8a8` would give wrong results on this CPU, as one line; None where it is exact."""
    missing = [f for f in W8A8_FLAGS if f not in cpu_flags()]
    if not missing:
        return None
    return (f"w8a8 needs a CPU with AVX-512 VNNI; this one lacks {', '.join(missing)}, and there PyTorch's int8 "
            "kernel (fbgemm) saturates int16 sums and puts outputs ~20% off: use --dtype w4a8, int8 or bfloat16")


def kernel_isa() -> str:
    """The build to run: `$VERISPEC_KERNEL_ISA` (avx512 | avxvnni | avx2) when set, else the best this CPU can run
    (and this machine's compiler can build: one without -mavxvnni, GCC < 11, falls back to the AVX2 build)."""
    want = os.environ.get(ISA_ENV, "").strip().lower()
    if want and want != "auto":
        if want not in ISA_FLAGS:
            raise KernelError(f"{ISA_ENV}={want!r}: choose one of {', '.join(ISAS)} (or auto)")
        missing = missing_cpu_flags(want)
        if missing:
            raise KernelError(f"{ISA_ENV}={want} but this CPU lacks {', '.join(missing)}")
        return want
    isas = [isa for isa in available_isas() if isa not in _unbuildable]
    if not isas:
        raise KernelError("w4a8 needs an x86 CPU with AVX-512 VNNI, or AVX2 with FMA and F16C; this one lacks "
                          f"{', '.join(missing_cpu_flags('avx2'))}: use --dtype int8 or bfloat16")
    return isas[0]


def w4a8(isa: str | None = None) -> ModuleType:
    """The compiled kernel module (`w4a8_mm`, `isa`) for `isa` (default: kernel_isa()); raises KernelError with
    what to do instead when it can't be."""
    if isa is None:  # the hot path (every matmul): one look-up
        want = os.environ.get(ISA_ENV)
        module = _chosen.get(want)
        if module is None:
            module = _chosen[want] = _build_best()
        return module
    if isa not in ISA_FLAGS:
        raise KernelError(f"unknown kernel build {isa!r}; choose one of {', '.join(ISAS)}")
    missing = missing_cpu_flags(isa)
    if missing:
        raise KernelError(f"the {isa} build of the w4a8 kernel needs {', '.join(missing)}, which this CPU lacks")
    return _build(isa)


_chosen: dict[str | None, ModuleType] = {}  # w4a8()'s module for each value of $VERISPEC_KERNEL_ISA seen
_unbuildable: set[str] = set()  # builds this machine's compiler failed, where a lesser one runs


def _build_best() -> ModuleType:
    """kernel_isa()'s build; where it is not forced and fails to compile, the next best (then kernel_isa() says so)."""
    while True:
        isa = kernel_isa()
        try:
            return _build(isa)
        except KernelError as e:
            forced = os.environ.get(ISA_ENV, "").strip().lower() not in ("", "auto")
            if forced or isa == "avx2" or isa not in available_isas():
                raise
            print(f"verispec: the {isa} kernel build failed ({str(e).splitlines()[0][:200]}); using the next best",
                  file=sys.stderr)
            _unbuildable.add(isa)

ATTENTION_ENV = "VERISPEC_ATTENTION"  # "sdpa": torch's attention, one query at a time (to compare, or to debug)


def attention_kernel() -> ModuleType | None:
    """The compiled module whose `attention` a CPU forward over a float32 KV cache uses, or None where it cannot be
    built (no x86 AVX2 CPU, no compiler) or `$VERISPEC_ATTENTION=sdpa`: models then use torch's attention."""
    if os.environ.get(ATTENTION_ENV, "").strip().lower() == "sdpa":
        return None
    return _kernel_or_none()


def _kernel_or_none() -> ModuleType | None:
    """w4a8()'s module, or None where it cannot be built (remembered per value of $VERISPEC_KERNEL_ISA)."""
    want = os.environ.get(ISA_ENV)
    if want not in _attention:
        try:
            _attention[want] = w4a8()
        except KernelError:
            _attention[want] = None
    return _attention[want]


_attention: dict[str | None, ModuleType | None] = {}  # _kernel_or_none()'s, per value of $VERISPEC_KERNEL_ISA

SAMPLING_ENV = "VERISPEC_SAMPLING"  # "torch": sampling.py's torch versions (to compare, or to debug)


def sampling_kernel() -> ModuleType | None:
    """The compiled module whose `softmax_t` and `sample_rows` do a CPU row's sampling (verispec.sampling), or None
    where it cannot be built or under `$VERISPEC_SAMPLING=torch`: sampling.py's torch code then runs."""
    if os.environ.get(SAMPLING_ENV, "").strip().lower() == "torch":
        return None
    return _kernel_or_none()


LAYER_ENV = "VERISPEC_LAYER"  # "python": a w4a8 model's layers run as torch calls (to compare, or to debug)


def layer_kernel() -> ModuleType | None:
    """The compiled module whose `layer_pre`/`layer_post` run a w4a8 model's layers (its matmul kernel is built
    wherever such a model runs), or None under `$VERISPEC_LAYER=python`."""
    if os.environ.get(LAYER_ENV, "").strip().lower() == "python":
        return None
    return w4a8()


def _import_built(name: str, path: Path) -> ModuleType:
    """The compiled module at `path` (what cpp_extension.load imports once it has built it)."""
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@functools.cache
def _build(isa: str) -> ModuleType:
    from torch.utils import cpp_extension

    from verispec.models.packaged import cache_dir

    cflags = isa_cflags(isa)
    sources = [Path(__file__).with_name(name) for name in SOURCES]
    code = b"".join(Path(__file__).with_name(name).read_bytes() for name in SOURCES + HEADERS)
    key = hashlib.sha256(code + " ".join([torch.__version__, sys.version, *cflags]).encode()).hexdigest()[:16]
    build = cache_dir() / "kernels" / f"w4a8-{isa}-{key}"
    build.mkdir(parents=True, exist_ok=True)
    name = f"verispec_w4a8_{isa}_{key}"
    # A build of this very code (the key) for this torch and Python is imported as it is: ninja's build file names
    # the sources' and the environment's paths, and would rebuild it (41 s of both cores on an AMD Zen 3) for every
    # other checkout or virtual environment that uses the cache, such as CI's fresh clone beside a working tree.
    built = build / f"{name}.so"
    if built.exists():
        try:
            return _import_built(name, built)
        except ImportError:  # a partial or broken file: built again below
            pass
    try:  # the `ninja` wheel puts its binary beside the interpreter, which is not on PATH unless the venv is active
        import ninja

        os.environ["PATH"] = ninja.BIN_DIR + os.pathsep + os.environ.get("PATH", "")
    except ImportError:
        pass
    print(f"compiling verispec's w4a8 CPU kernel for {isa} (once per machine: 10-60 s)...", file=sys.stderr)
    try:
        return cpp_extension.load(name=name, sources=[str(src) for src in sources], extra_cflags=cflags,
                                  extra_ldflags=LDFLAGS,
                                  build_directory=str(build), verbose=False)
    except (RuntimeError, OSError, ImportError) as e:  # no compiler, no ninja, a failed build
        raise KernelError(f"cannot build the w4a8 kernel in {build} ({e}); it needs g++ and ninja "
                          "(pip install ninja): use --dtype int8 or bfloat16 meanwhile") from e
