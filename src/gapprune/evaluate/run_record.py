"""`run.json`: what a run took and on what machine, so a reader can predict the time on theirs.

Machines differ threefold in speed; the record names the processor and thread count and gives a
throughput figure (dense forward tokens per second in the calibration pass), so another machine's
time is this run's wall time scaled by the ratio of the two throughputs.
"""

from __future__ import annotations

import datetime
import os
import platform
from pathlib import Path
from typing import Any

import torch

from gapprune.distributed import group_info
from gapprune.phases import PEAK_RSS_AFTER, peak_rss_mb


def processor_name() -> str:
    """The CPU model as the OS reports it (Linux: /proc/cpuinfo), else what `platform` knows."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine_record(device: str = "cpu") -> dict[str, Any]:
    """The facts that decide how fast a run goes here."""
    record: dict[str, Any] = {
        "processor": processor_name(), "arch": platform.machine(), "cores": os.cpu_count(),
        "torch_threads": torch.get_num_threads(), "torch": torch.__version__, "python": platform.python_version(),
        "device": device,
    }
    if torch.device(device).type == "cuda" and torch.cuda.is_available():
        record["gpu"] = torch.cuda.get_device_name(torch.device(device))
    return record


def run_record(wall_s: float, phases: dict[str, float], calibration_tokens: int, *, device: str = "cpu",
               command: list[str] | None = None, dtype: str = "") -> dict[str, Any]:
    """The record of one prune run: wall time, phases, machine, peak memory, and a throughput figure."""
    capture = phases.get("capture", 0.0)
    record: dict[str, Any] = {
        "date": datetime.date.today().isoformat(),
        "command": " ".join(command) if command else "",
        "wall_s": round(wall_s, 1),
        "phases": phases,
        "peak_rss_mb": peak_rss_mb(),
        "peak_rss_mb_after": {phase: PEAK_RSS_AFTER[phase] for phase in phases if phase in PEAK_RSS_AFTER},
        "dtype": dtype,
        "machine": machine_record(device),
        "throughput": {
            "calibration_tokens": calibration_tokens,
            "dense_forward_tokens_per_s": round(calibration_tokens / capture, 1) if capture > 0 else None,
        },
    }
    group = group_info()
    if group is not None:  # under torchrun: the backend whose collective ran
        record["process_group"] = group
    if torch.device(device).type == "cuda" and torch.cuda.is_available():  # what decides the GPU a run needs
        record["peak_gpu_mb"] = round(torch.cuda.max_memory_allocated(torch.device(device)) / 2**20, 1)
    return record
