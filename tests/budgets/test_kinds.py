"""Budgets and runtimes are types: each kind says for itself how it is checked, solved and described, and no
code outside the budget module asks a budget's kind or an allocator's name."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import gapprune
from gapprune.allocate import ALLOCATORS
from gapprune.budget import (
    MemoryBudget,
    ParamsBudget,
    RatioBudget,
    SpeedupBudget,
    budget_from_record,
)

SOURCE = Path(gapprune.__file__).parent
BUDGET_MODULE = SOURCE / "budget.py"
KIND_NAMES = {"ratio", "params", "speedup", "memory"}


def branches_on_names(tree: ast.AST, names: set[str]) -> list[int]:
    """Lines comparing a value with one of `names` (`x == "gap"`, `x in ("ratio", "params")`): a branch on a
    kind or allocator name. `"speedup" in record` asks a mapping for a key and is not one."""
    lines = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Compare):
            continue
        operands = [node.left, *node.comparators]
        candidates: list[ast.expr] = []
        for op, right in zip(node.ops, operands[1:]):
            if isinstance(op, (ast.Eq, ast.NotEq)):
                candidates += [operands[operands.index(right) - 1], right]
            elif isinstance(op, (ast.In, ast.NotIn)) and isinstance(right, (ast.Tuple, ast.List, ast.Set)):
                candidates += right.elts
        if any(isinstance(c, ast.Constant) and c.value in names for c in candidates):
            lines.append(node.lineno)
    return lines


def test_no_module_but_the_budget_module_branches_on_a_kind_or_an_allocator_name() -> None:
    names = KIND_NAMES | set(ALLOCATORS.names()) | {f"gap-{kind}" for kind in KIND_NAMES}
    found = {str(path.relative_to(SOURCE)): lines for path in sorted(SOURCE.rglob("*.py"))
             if path != BUDGET_MODULE and (lines := branches_on_names(ast.parse(path.read_text()), names))}
    assert found == {}


def test_the_scan_sees_a_branch_on_a_kind() -> None:
    tree = ast.parse('if budget.kind == "speedup": pass\nif allocator not in ("gap", "owl"): pass\nx = a == 1\n'
                     'y = "speedup" in record')
    assert branches_on_names(tree, KIND_NAMES | {"gap"}) == [1, 2]


@pytest.mark.parametrize("budget", [RatioBudget(0.25, "decoder"), ParamsBudget(1000), SpeedupBudget(1.5),
                                    MemoryBudget(250e6, 4096)])
def test_a_budget_survives_its_record(budget) -> None:
    assert budget_from_record(budget.to_record()) == budget


def test_records_written_before_the_kinds_were_types_still_load() -> None:
    old = {"kind": "ratio", "target": 0.25, "context": 0, "of": "model"}  # plan.json of 2026-12-05
    assert budget_from_record(old) == RatioBudget(0.25)
    with pytest.raises(ValueError, match="budget kind must be one of"):
        budget_from_record({"kind": "bananas", "target": 1})


def test_each_kind_checks_its_own_value() -> None:
    with pytest.raises(ValueError, match="strictly between 0 and 1"):
        RatioBudget(1.5)
    with pytest.raises(ValueError, match="positive whole number"):
        ParamsBudget(2.5)
    with pytest.raises(ValueError, match="at least 1"):
        SpeedupBudget(0.5)
    with pytest.raises(ValueError, match="positive bytes"):
        MemoryBudget(1e6, 0)
    assert RatioBudget(0.25, "decoder").params(1000, 800) == 200 and RatioBudget(0.25).params(1000) == 250


def test_the_command_line_offers_every_registered_runtime() -> None:
    from gapprune.cli.budgets import RUNTIME_NAMES
    from gapprune.runtimes import RUNTIMES

    assert sorted(RUNTIME_NAMES) == RUNTIMES.names()
    for name in RUNTIMES.names():
        runtime = RUNTIMES.get(name)
        assert runtime.name == name and runtime.budgets and runtime.measures
