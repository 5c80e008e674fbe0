"""Result files shared by benchmark runs: a long run must not erase what another wrote meanwhile."""

from __future__ import annotations

import json
from pathlib import Path

from tests.benchmarks.scripts import benchmark_script

_common = benchmark_script("common")
ResultLog = _common.ResultLog


def test_two_logs_on_one_file_keep_each_others_records(tmp_path: Path) -> None:
    path = tmp_path / "results.json"
    long_run, short_run = ResultLog(path), ResultLog(path)  # both read the (absent) file at start
    long_run.emit({"run": "long", "step": 1})
    short_run.emit({"run": "short"})
    long_run.emit({"run": "long", "step": 2})
    records = json.loads(path.read_text())
    assert [r["run"] for r in records] == ["long", "short", "long"]
    assert all({"date", "machine", "command"} <= r.keys() for r in records)
    assert ResultLog(path).done(run="short") and not ResultLog(path).done(run="other")
    assert not list(tmp_path.glob("*.partial"))


def test_recorded_commands_name_no_path_of_this_machine() -> None:
    root = _common.REPOSITORY
    argv = [str(root / "benchmarks" / "protocols.py"), "--out", str(root / "docs" / "results" / "p.json"),
            f"--data-dir={root.parent / 'shared' / 'data'}", "--models", "runs/x"]
    assert _common.portable_command(argv) == ("python benchmarks/protocols.py --out docs/results/p.json "
                                              "--data-dir=../shared/data --models runs/x")


def test_a_folder_counts_as_pruned_by_a_command_only_when_its_run_record_names_that_command(tmp_path: Path) -> None:
    pruned_by = _common.pruned_by
    folder = tmp_path / "m"
    folder.mkdir()
    command = ["prune", "m0", "--ratio", "0.25", "--calib", "c4", "--out", str(folder), "--no-plots"]
    (folder / "run.json").write_text(json.dumps({"command": "gapprune " + " ".join(command[:-1])}))
    assert not pruned_by(str(folder), command)  # no plan.json: a stopped prune
    (folder / "plan.json").write_text("{}")
    assert pruned_by(str(folder), command)  # plots or not, the same plan
    assert not pruned_by(str(folder), [w if w != "c4" else "self" for w in command])
    assert not pruned_by(str(tmp_path / "absent"), command)
