"""`import gapprune.a.b as m` gives the module b for every module of the package, as Python promises."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import types
from pathlib import Path

import pytest

import gapprune

SOURCE = Path(gapprune.__file__).parent
NEEDS_VLLM = {"gapprune.serving.vllm_models"}  # runs inside a vLLM process (tests/serving checks it there)
RUNS_ON_IMPORT = {"gapprune.__main__"}  # `python -m gapprune`: importing it runs the command line


def every_module() -> list[str]:
    names = []
    for path in sorted(SOURCE.rglob("*.py")):
        parts = list(path.relative_to(SOURCE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        names.append(".".join(parts))
    return names


@pytest.mark.parametrize("name", [n for n in every_module() if "." in n and n not in NEEDS_VLLM | RUNS_ON_IMPORT])
def test_import_as_gives_the_module(name):
    namespace: dict[str, object] = {}
    exec(f"import {name} as m", namespace)  # noqa: S102 - the import form under test
    assert isinstance(namespace["m"], types.ModuleType) and namespace["m"].__name__ == name


def test_the_exported_functions_stay_functions_after_their_code_modules_are_imported():
    script = ("import gapprune.pruning.surgery as s, gapprune.tune.distillation as d, gapprune, gapprune.tune\n"
              "import types\n"
              "assert isinstance(s, types.ModuleType) and isinstance(d, types.ModuleType)\n"
              "assert callable(gapprune.prune) and callable(gapprune.tune.distill)\n"
              "assert not isinstance(gapprune.prune, types.ModuleType)\n")
    subprocess.run([sys.executable, "-c", script], check=True)


def test_the_vllm_model_module_is_only_left_out_because_vllm_is_absent():
    assert importlib.util.find_spec("gapprune.serving.vllm_models") is not None
