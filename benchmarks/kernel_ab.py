"""A/B two (or more) versions of the w4a8 kernel source with the same compiler flags: bit-identity, then ms per matmul.

    git show HEAD:verispec/models/kernels/w4a8.cpp > /tmp/old.cpp
    python benchmarks/kernel_ab.py /tmp/old.cpp verispec/models/kernels/w4a8.cpp [more.cpp ...] [--isa avx512|avxvnni|avx2]

Each matrix shape runs with its weights in enough copies, cycled, to pass 64 MB (more than the L3: at least 8 copies;
a small matrix in 8 copies would stay in the L3 and time the kernel's arithmetic, not its reads), the versions interleaved (the order reversed
every other repetition), median of 15. Prints each version's ms over the first's and the GB/s of weights and scales
read by the last. On a shared machine compare within one run only.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import torch
from torch.utils import cpp_extension

from verispec.models import kernels
from verispec.models.kernels import ISA_CFLAGS, isa_cflags
from verispec.models.quant import W4A8Linear


def build_version(src: str, isa: str, tag: str, replaces: str = "w4a8.cpp") -> ModuleType:
    """The kernel module with `src` in place of the package's source `replaces` (its other sources and headers, its
    flags for `isa`), compiled under its own name so that several versions load into one process."""
    here = Path(kernels.__file__).parent
    if replaces not in kernels.SOURCES:
        raise ValueError(f"{replaces!r} is not one of the kernel's sources ({', '.join(kernels.SOURCES)})")
    build = Path(tempfile.mkdtemp(prefix=f"kernel-ab-{tag}-"))
    copy = build / f"{Path(replaces).stem}_{tag}.cpp"
    copy.write_text(Path(src).read_text())
    others = [str(here / name) for name in kernels.SOURCES if name != replaces]
    return cpp_extension.load(name=f"kernel_ab_{isa}_{tag}", sources=[str(copy), *others],
                              extra_cflags=[*isa_cflags(isa), f"-I{here}"], extra_ldflags=kernels.LDFLAGS,
                              build_directory=str(build))


def weight_copies(n: int, k: int, bits: int) -> list[W4A8Linear]:
    """Random n x k matrices packed at `bits`, in enough copies to pass 64 MB (at least 8), for timing them cycled:
    one small matrix would stay in the caches and time the kernel's arithmetic, not its reads."""
    copies = max(8, -(-64_000_000 // (n * k * bits // 8)))
    return [W4A8Linear(torch.nn.Linear(k, n, bias=False), bits=bits) for _ in range(copies)]


def median_ms(call: Callable[[str, W4A8Linear], object], tags: list[str], mats: list[W4A8Linear],
              reps: int = 15) -> dict[str, float]:
    """Each tag's median ms a matrix of `call(tag, matrix)` over `mats`, the tags interleaved and their order reversed
    every other repetition, so all see the same machine load."""
    times: dict[str, list[float]] = {tag: [] for tag in tags}
    for rep in range(reps):
        for tag in tags if rep % 2 else tags[::-1]:
            t0 = time.perf_counter()
            for q in mats:
                call(tag, q)
            times[tag].append((time.perf_counter() - t0) / len(mats) * 1e3)
    return {tag: statistics.median(times[tag]) for tag in tags}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("sources", nargs="+", metavar="SOURCE", help="kernel sources, the first the baseline (at least 2)")
    ap.add_argument("--isa", default="avx512", choices=list(ISA_CFLAGS))
    ap.add_argument("--shapes", default="8960x1536,1536x8960", help="out x in, comma list")
    ap.add_argument("--rows", default="1,5", help="rows (tokens) of x, comma list")
    ap.add_argument("--bits", default="4,8", help="weight bits, comma list (4, 6, 8)")
    ap.add_argument("--no-check", action="store_true",
                    help="skip the outputs' comparison: for timing probes that compute something else on purpose")
    ap.add_argument("--rounding-may-differ", action="store_true",
                    help="a version that sums in another order: within 1e-5 of the baseline's largest output")
    args = ap.parse_args()
    if len(args.sources) < 2:
        ap.error("give at least two kernel sources")
    tags = [chr(ord("a") + i) for i in range(len(args.sources))]
    mods = {tag: build_version(src, args.isa, tag) for tag, src in zip(tags, args.sources)}
    torch.manual_seed(0)
    for shape in args.shapes.split(","):
        n, k = (int(v) for v in shape.split("x"))
        for bits in (int(b) for b in args.bits.split(",")):
            mats = weight_copies(n, k, bits)
            for rows in (int(r) for r in args.rows.split(",")):
                x = torch.randn(rows, k)

                def call(tag: str, q: W4A8Linear) -> torch.Tensor:
                    return mods[tag].w4a8_mm(x, *q.operands()[:3], torch.empty(0))

                first = call("a", mats[0])
                for tag in tags[1:] if not args.no_check else []:
                    other = call(tag, mats[0])
                    if args.rounding_may_differ:
                        err = (other - first).abs().max() / first.abs().max()
                        assert err < 1e-5, f"version {tag} differs from a by {err:.2e} of its largest output"
                    else:
                        assert torch.equal(first, other), f"version {tag} is not bit-identical to a"
                ms = median_ms(call, tags, mats)
                nbytes = sum(t.numel() * t.element_size() for t in mats[0].operands()[:3])
                cells = ", ".join(f"{tag} {ms[tag]:.3f} ms" for tag in tags)
                ratios = ", ".join(f"{tag}/a {ms[tag] / ms['a']:.2f}" for tag in tags[1:])
                print(f"{args.isa} {n}x{k} {bits}-bit, {rows} row(s): {cells}, {ratios} "
                      f"({nbytes / 1e6:.1f} MB: {nbytes / ms[tags[-1]] / 1e6:.1f} GB/s)", flush=True)


if __name__ == "__main__":
    main()
