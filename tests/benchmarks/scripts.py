"""Loading a benchmark script into a test: benchmarks/ is not a package, so each is loaded from its file."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def benchmark_script(name: str) -> ModuleType:
    """benchmarks/NAME.py as a module; it may import common.py beside it, which is then forgotten again, so no
    benchmark module stays importable under its own name (test_script_names checks that none shadows a package)."""
    spec = importlib.util.spec_from_file_location(f"benchmarks_{name}", BENCHMARKS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    path_before = list(sys.path)
    sys.path.insert(0, str(BENCHMARKS))
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path[:] = path_before
        sys.modules.pop("common", None)
    return module
