"""Resumable JSON result files for the benchmarks: every record carries the date, machine and command."""

from __future__ import annotations

import json
import platform
import sys
from datetime import date
from pathlib import Path
from typing import Any

import torch


def machine(device: str = "cpu") -> str:
    where = torch.cuda.get_device_name() if device.startswith("cuda") else \
        f"{platform.machine()} CPU, {torch.get_num_threads()} threads"
    return f"{where}, torch {torch.__version__}"


class ResultLog:
    """A list of flat records in a JSON file, rewritten after each record so a killed run keeps its results.

    `resume`: keep the records already in the file (and let the caller skip them); else start it afresh.
    """

    def __init__(self, path: str | Path, device: str = "cpu", resume: bool = True) -> None:
        self.path = Path(path)
        self.records: list[dict[str, Any]] = json.loads(self.path.read_text()) if resume and self.path.exists() else []
        self.meta = {"date": str(date.today()), "machine": machine(device), "command": "python " + " ".join(sys.argv)}

    def emit(self, record: dict[str, Any]) -> None:
        record = {**record, **self.meta}
        print(json.dumps(record), flush=True)
        self.records.append(record)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text(json.dumps(self.records, indent=1) + "\n")
