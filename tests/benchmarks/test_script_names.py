"""A benchmark script runs with benchmarks/ first on sys.path: its name must not hide an installed module."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

SCRIPTS = sorted((Path(__file__).resolve().parents[2] / "benchmarks").glob("*.py"))


def shadowed(script: Path) -> str | None:
    """Where the installed module lives that a script of this name would hide, or None."""
    spec = importlib.util.find_spec(script.stem)
    return None if spec is None else str(spec.origin)


@pytest.mark.parametrize("script", SCRIPTS, ids=[s.stem for s in SCRIPTS])
def test_no_benchmark_script_shadows_an_installed_module(script: Path) -> None:
    # benchmarks/gguf.py once hid the gguf package from transformers' GGUF loader
    origin = shadowed(script)
    assert origin is None, f"benchmarks/{script.name} shadows the installed module {origin}: rename the script"


def test_the_check_sees_a_shadowing_name() -> None:
    assert shadowed(Path("benchmarks/gguf.py")) is not None  # the name that once collided
    assert shadowed(Path("benchmarks/no_module_is_called_this.py")) is None
