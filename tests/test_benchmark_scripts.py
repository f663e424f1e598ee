"""The benchmark scripts still import: a name they take from verispec that is renamed or removed fails here, not
in the middle of a measurement session (benchmarks/verify_cost_in_round.py imported a removed helper once)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).parent.parent / "benchmarks"
SCRIPTS = sorted(p for p in BENCHMARKS.glob("*.py") if 'if __name__ == "__main__":' in p.read_text())


@pytest.mark.parametrize("script", SCRIPTS, ids=[p.stem for p in SCRIPTS])
def test_benchmark_script_imports(script: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(BENCHMARKS))  # as when it runs as a script: its folder first on sys.path
    spec = importlib.util.spec_from_file_location(f"bench_script_{script.stem}", script)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # runs the imports and definitions, not main()
    assert callable(getattr(module, "main", None)), f"{script.name} has no main()"
