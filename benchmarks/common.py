"""What the benchmarks share: settings, flags, resumable result files, the dense profile.

The records in docs/results/ were measured with these values. The allocator study calibrated with
`bench_config` and one dense profile folder (`PROFILE`), which `plans.py` reads again to check that the
plans it recorded still come out of the code.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
from datetime import date
from pathlib import Path
from typing import Any

import torch

MODEL = "smollm2-135m"
GAPPRUNE = str(Path(sys.executable).with_name("gapprune"))  # the CLI of this environment, run as a user runs it
PROFILE = "runs/bench_profile"  # the dense exact profile the SmolLM2 studies reuse (written by the first)
# Calibration: 32 windows x 128 tokens of WikiText-2 validation for statistics, the first 4 (512 tokens) for ΔL.
CALIBRATION: dict[str, Any] = {"criterion": "activation", "metric": "kl", "calib": "wikitext2", "calib_split": "validation",
                               "calib_samples": 32, "profile_samples": 4, "seq_len": 128, "batch_size": 4, "mlp_stride": 4}
ALLOCATORS = ["gap", "uniform", "global", "depth", "owl"]
RATIOS = [0.125, 0.25, 0.375, 0.5]


def machine(device: str = "cpu") -> str:
    where = torch.cuda.get_device_name() if device.startswith("cuda") else \
        f"{platform.machine()} CPU, {torch.get_num_threads()} threads"
    return f"{where}, torch {torch.__version__}"


REPOSITORY = Path(__file__).resolve().parents[1]


def portable_command(argv: list[str]) -> str:
    """The command as a reader runs it from the repository root: absolute paths (this machine's) become
    relative to the root, e.g. `--data-dir /home/me/shared/data` -> `--data-dir ../shared/data`."""
    def portable(arg: str) -> str:
        flag, eq, value = arg.rpartition("=") if arg.startswith("--") and "=" in arg else ("", "", arg)
        return flag + eq + (os.path.relpath(value, REPOSITORY) if value.startswith("/") else value)

    return "python " + " ".join(portable(a) for a in argv)


class ResultLog:
    """A list of flat records in a JSON file, rewritten after each record so a killed run keeps its results.

    Each write re-reads the file first, so runs writing one file side by side (or edits made while a
    long run is going) do not lose each other's records.

    Every record gets the date, machine and command; `done` finds the records already in the file.
    """

    def __init__(self, path: str | Path, device: str = "cpu") -> None:
        self.path = Path(path)
        self.records: list[dict[str, Any]] = json.loads(self.path.read_text()) if self.path.exists() else []
        self.meta = {"date": str(date.today()), "machine": machine(device), "command": portable_command(sys.argv)}

    def emit(self, record: dict[str, Any]) -> None:
        """Append to the file as it is now: records another run wrote since this one started stay."""
        record = {**record, **self.meta}
        print(json.dumps(record), flush=True)
        if self.path.exists():
            self.records = json.loads(self.path.read_text())
        self.records.append(record)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        partial = self.path.with_suffix(".partial")
        partial.write_text(json.dumps(self.records, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
        partial.replace(self.path)

    def done(self, **labels: Any) -> bool:
        """Whether a record with these fields is in the file."""
        return any(all(k in r and r[k] == v for k, v in labels.items()) for r in self.records)


def pruned_by(folder: str, command: list[str]) -> bool:
    """Whether `folder` holds the output of `command` (plots aside), so a rerun measures it instead of pruning."""
    run = Path(folder, "run.json")
    if not (run.is_file() and Path(folder, "plan.json").is_file()):
        return False
    recorded = json.loads(run.read_text()).get("command", "").split()
    return [w for w in recorded if w != "--no-plots"] == ["gapprune", *(w for w in command if w != "--no-plots")]


def parser(description: str | None, out: str | None = None) -> argparse.ArgumentParser:
    """--model, --data-dir and --out, with the shared defaults."""
    p = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=MODEL)
    p.add_argument("--data-dir", default=None, help="data folder (else $GAPPRUNE_DATA, else the hub)")
    p.add_argument("--out", default=out, required=out is None)
    return p


def bench_config(data_dir: str | None, **overrides: Any):  # type: ignore[no-untyped-def]
    """The benchmarks' pruning settings; `ratio` and `allocator` are per plan, not part of the profile."""
    from gapprune.config import PruneConfig

    return PruneConfig(**{"ratio": 0.25, "allocator": "gap", "compensate": "none", "data_dir": data_dir,
                          **CALIBRATION, **overrides})


def bf16_flags() -> list[str]:
    """The CPU's bf16 features a record names: AVX-512-BF16 and AMX (bf16 is fast only with AMX)."""
    from gapprune.engine.replay import cpu_flags

    return sorted(cpu_flags() & {"avx512_bf16", "amx_bf16"})
