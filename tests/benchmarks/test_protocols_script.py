"""benchmarks/protocols.py: a protocol's data sets are recorded one by one, so a stopped run keeps the finished ones."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.benchmarks.scripts import benchmark_script

protocols = benchmark_script("protocols")


def printing(*lines: str, exit_code: int = 0) -> list[str]:
    """A stand-in for `gapprune ppl`: prints these lines, then exits with this code."""
    body = "".join(f"print({line!r}, flush=True)\n" for line in lines)
    return [sys.executable, "-c", body + f"raise SystemExit({exit_code})"]


def test_each_printed_record_is_yielded_and_other_lines_pass_through(capsys: pytest.CaptureFixture[str]) -> None:
    first, second = {"dataset": "wikitext2", "ppl": 39.05}, {"dataset": "ptb", "ppl": 60.0}
    scored = list(protocols.scored_sets(printing(json.dumps(first), "a warning", json.dumps(second))))
    assert [record for record, _ in scored] == [first, second]
    assert scored[0][1] <= scored[1][1]
    assert "a warning" in capsys.readouterr().out


def test_a_run_that_fails_after_one_set_has_yielded_that_set_then_raises() -> None:
    first = {"dataset": "wikitext2", "ppl": 39.05}
    scored = protocols.scored_sets(printing(json.dumps(first), exit_code=3))
    assert next(scored)[0] == first
    with pytest.raises(subprocess.CalledProcessError):
        next(scored)
