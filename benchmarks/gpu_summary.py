"""The GPU check's bookkeeping (`benchmarks/gpu_check.sh`): a record per step as it ends, the run's summary
rewritten after every step, and the summary turned into `docs/results/gpu.json`'s records.

    python benchmarks/gpu_summary.py step RUNS NAME RC WALL_S LIMIT_S
    python benchmarks/gpu_summary.py collect RUNS SUMMARY.json DEVICE SHAPE
    python benchmarks/gpu_summary.py record docs/results/gpu.json DIR...
"""

from __future__ import annotations

import datetime
import json
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

PLAN_TEST = "test_cuda_plan_equals_the_cpu_plan_on_a_seeded_tiny_model"
NCCL_TEST = "test_torchrun_on_one_gpu_uses_nccl_and_gives_the_plain_plan"
STEPS = ("tests", "make", "prune", "torchrun")


def step(runs: Path, name: str, rc: int, wall_s: int, limit_s: int) -> None:
    record: dict[str, Any] = {"step": name, "rc": rc, "wall_s": wall_s, "limit_s": limit_s, "timed_out": rc == 124}
    if rc != 0:
        record["log_tail"] = (runs / f"{name}.log").read_text(errors="replace")[-3000:]
    (runs / f"{name}.step.json").write_text(json.dumps(record))


def _device_facts(device: str) -> dict[str, Any]:
    import torch

    facts: dict[str, Any] = {"torch": torch.__version__, "device": device}
    if device.startswith("cuda") and torch.cuda.is_available():
        facts["gpu"] = torch.cuda.get_device_name(0)
        facts["gpu_memory_mb"] = round(torch.cuda.get_device_properties(0).total_memory / 2**20)
        smi = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, check=False)
        facts["driver"] = smi.stdout.strip()
    return facts


def _tests(runs: Path) -> dict[str, Any]:
    path = runs / "tests.xml"
    if not path.is_file():
        return {}
    root = ET.parse(path).getroot()
    suite = root if root.tag == "testsuite" else root.find("testsuite")
    assert suite is not None
    counts = {k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")}
    outcome = {}
    for case in suite.iter("testcase"):
        name = case.get("name", "")
        outcome[name] = ("failed" if case.find("failure") is not None or case.find("error") is not None
                         else "skipped" if case.find("skipped") is not None else "passed")
    return {**counts, "outcome": outcome}


def _weights_mb(model: Path) -> float | None:
    files = list(model.glob("*.safetensors"))
    return round(sum(f.stat().st_size for f in files) / 2**20, 1) if files else None


def collect(runs: Path, summary: Path, device: str, shape: str) -> None:
    out: dict[str, Any] = {"date": datetime.date.today().isoformat(), "shape": shape, **_device_facts(device),
                           "steps": {}}
    for name in STEPS:
        path = runs / f"{name}.step.json"
        out["steps"][name] = json.loads(path.read_text()) if path.is_file() else {"step": name, "rc": None}
    out["tests"] = _tests(runs)
    out["weights_mb"] = _weights_mb(runs / f"qwen2.5-{shape}-shaped")
    for name in ("prune", "torchrun"):
        run = runs / name / "run.json"
        out[name] = json.loads(run.read_text()) if run.is_file() else None
    summary.write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps({name: out["steps"][name].get("rc") for name in STEPS}))


def records(summary: dict[str, Any]) -> list[dict[str, Any]]:
    """docs/results/gpu.json's records of one run's summary (kinds gpu_tests, cpu_cuda_plan, prune_run, nccl)."""
    where = {k: summary.get(k) for k in ("device", "gpu", "gpu_memory_mb", "driver", "torch", "date")}
    out: list[dict[str, Any]] = []
    tests = summary.get("tests") or {}
    if tests:
        outcome = tests["outcome"]
        out.append({"kind": "gpu_tests", **where, "passed": sum(v == "passed" for v in outcome.values()),
                    "failed": sum(v == "failed" for v in outcome.values()),
                    "skipped": sum(v == "skipped" for v in outcome.values()),
                    "failed_tests": sorted(k for k, v in outcome.items() if v == "failed"),
                    "command": "pytest -q -m gpu tests/gpu"})
        if outcome.get(PLAN_TEST) in ("passed", "failed"):
            out.append({"kind": "cpu_cuda_plan", **where, "identical": outcome[PLAN_TEST] == "passed",
                        "model": "seeded tiny Llama", "command": f"pytest -m gpu tests/gpu -k {PLAN_TEST}"})
    prune = summary.get("prune")
    if prune:
        out.append({"kind": "prune_run", **where, "model": f"qwen2.5-{summary['shape']}-shaped (random weights)",
                    "dtype": prune.get("dtype"), "ratio": 0.25, "ratio_of": "decoder", "wall_s": prune["wall_s"],
                    "phases": prune["phases"], "peak_gpu_mb": prune.get("peak_gpu_mb"),
                    "peak_rss_mb": prune.get("peak_rss_mb"), "weights_mb": summary.get("weights_mb"),
                    "command": prune.get("command")})
    torchrun = summary.get("torchrun")
    group = (torchrun or {}).get("process_group") or {}
    if torchrun or outcome_of(tests, NCCL_TEST):  # the tiny model's test asserts an NCCL all-reduce ran, too
        on_the_prune = "nccl" in str(group.get("backend")) and bool(group.get("cuda_all_reduce"))
        out.append({"kind": "nccl", **where, "world_size": group.get("world_size", 1), "backend": group.get("backend"),
                    "ok": on_the_prune or outcome_of(tests, NCCL_TEST) == "passed", "on_the_prune": on_the_prune,
                    "wall_s": (torchrun or {}).get("wall_s"), "tiny_model_test": outcome_of(tests, NCCL_TEST),
                    "command": (torchrun or {}).get("command")})
    return out


def outcome_of(tests: dict[str, Any], name: str) -> str | None:
    return (tests.get("outcome") or {}).get(name)


def record(target: Path, folders: list[str]) -> None:
    new = [r for folder in folders for r in records(json.loads((Path(folder) / "gpu-check.json").read_text()))]
    kept = json.loads(target.read_text()) if target.is_file() else []
    target.write_text(json.dumps(kept + new, indent=1, ensure_ascii=False) + "\n")
    print(f"{target}: {len(new)} records added")


def main() -> None:
    command, args = sys.argv[1], sys.argv[2:]
    if command == "step":
        step(Path(args[0]), args[1], int(args[2]), int(args[3]), int(args[4]))
    elif command == "collect":
        collect(Path(args[0]), Path(args[1]), args[2], args[3])
    elif command == "record":
        record(Path(args[0]), args[1:])
    else:
        raise SystemExit(f"unknown command {command!r}: step, collect or record")


if __name__ == "__main__":
    main()
