"""The package type-checks: mypy (settings in pyproject.toml) finds no error in src/.

Every model-facing function names what it takes (a transformers `PreTrainedModel`, a peft model, a
plain module) and the surgery names the submodules it rewrites (`AttentionModules`,
`GatedMLPModules`), so a change that breaks those contracts fails here before it fails at runtime.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.skipif(importlib.util.find_spec("mypy") is None, reason="mypy is not installed (pip install -e '.[dev]')")
def test_the_package_type_checks() -> None:
    done = subprocess.run([sys.executable, "-m", "mypy", "src"], check=False, cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
