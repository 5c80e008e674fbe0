"""The engine is the only code that runs decoder layers over cached inputs or hooks a module.

A profiler, the plan check, Gram collection or sequential compensation that walked the layers itself
would be another layer loop with its own casts and hooks, free to drift from the others; these scans
fail when one appears anywhere outside `engine/`. The model definitions are the exception they must be:
`models/` (the pruned model's forward, and the streamed model's pre-hook that reads a layer's weights as
any forward reaches it) and `serving/` (vLLM's forward).
"""

from __future__ import annotations

import ast
from pathlib import Path

import gapprune

SOURCE = Path(gapprune.__file__).parent
MODEL_DEFINITIONS = ("engine", "models", "serving")  # the engine itself, and the forwards it calls
ENGINE_MAY_IMPORT = {"engine", "models", "components", "registry"}


def _calls_a_layer(node: ast.AST) -> bool:
    """`x.layers[i](...)`: a decoder layer called directly."""
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Subscript)
            and isinstance(node.func.value, ast.Attribute) and node.func.value.attr == "layers")


def _findings(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and any(alias.name == "run_layer" for alias in node.names):
            found.append(f"{path.name}:{node.lineno} imports run_layer")
        if _calls_a_layer(node):
            found.append(f"{path.name}:{node.lineno} calls a decoder layer")
        if isinstance(node, ast.Attribute) and node.attr in ("register_forward_pre_hook", "register_forward_hook"):
            found.append(f"{path.name}:{node.lineno} hooks a module")
    return found


def test_the_scan_sees_a_layer_call_and_a_hook(tmp_path):
    path = tmp_path / "probe.py"
    path.write_text("h = adapter.layers[3](h, **kw)\nout.register_forward_pre_hook(f)\n"
                    "from gapprune.engine.capture import run_layer\n")
    assert len(_findings(path)) == 3


def test_no_package_outside_the_engine_runs_a_layer_or_hooks_a_module():
    clients = [path for path in sorted(SOURCE.rglob("*.py"))
               if path.relative_to(SOURCE).parts[0] not in MODEL_DEFINITIONS]
    assert len(clients) > 60  # every package but the engine and the model definitions
    assert [f for path in clients for f in _findings(path)] == []


def test_the_engine_knows_no_scores_options_or_profilers():
    """The engine sits below its clients: it imports models, components and the registry, never what calls it."""
    reached = set()
    for path in (SOURCE / "engine").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("gapprune."):
                reached.add(node.module.split(".")[1])
    assert reached and reached <= ENGINE_MAY_IMPORT, reached - ENGINE_MAY_IMPORT
