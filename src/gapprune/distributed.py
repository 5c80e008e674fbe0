"""Exact profiling shared across processes started by `torchrun`: ranks split the replays by start layer.

`torchrun --nproc-per-node N -m gapprune prune ...` sets RANK, WORLD_SIZE and LOCAL_RANK; without
them the world size is 1 and nothing here talks to anyone, so the same command runs as before.

* Work: the exact ΔL of start layer l replays layers l...L for every option, so its cost is about
  (L − l + 1) layer passes per option. `shard_layers` hands the start layers out by that cost
  (largest first, each to the least loaded rank), deterministically on every rank.
* Result: every rank measures its layers' rows, `gather_table` gives every rank all rows (a few KB
  of numbers through `all_gather_object`), and every rank then solves the same DP on the same
  table; only rank 0 (`is_main`) does surgery and writes the output.
* Failure: a rank that raises exits non-zero, its peers' pending collective fails or torchrun stops
  them (SIGTERM, turned into `SystemExit` here so that temporary folders are removed), and the run
  fails with the failing rank named; the output folder is only ever written by rank 0, atomically.

Backend: gloo for CPU models, NCCL (with gloo for Python objects) for CUDA ones.
"""

from __future__ import annotations

import os
import signal
import socket
from datetime import timedelta
from types import FrameType
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from gapprune.allocate.table import LossTable


def world_size() -> int:
    return int(os.environ.get("WORLD_SIZE", "1"))


def rank() -> int:
    return int(os.environ.get("RANK", "0"))


def is_main() -> bool:
    """True on rank 0 and in a plain (non-torchrun) run: the process that writes results."""
    return rank() == 0


def describe() -> str:
    """'rank r of n' under torchrun, '' otherwise (for error messages)."""
    return f"rank {rank()} of {world_size()}" if world_size() > 1 else ""


def _stop(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(f"{describe()}: stopped by signal {signum} (another rank failed)")


def rank_device(device: str, local_rank: int, local_ranks: int, visible_gpus: int) -> str:
    """The device of one rank among `local_ranks` on this machine that sees `visible_gpus` GPUs.

    A bare "cuda" becomes "cuda:LOCAL_RANK", so N ranks use N GPUs; a rank that sees one GPU (launchers
    such as SLURM give each rank its own through CUDA_VISIBLE_DEVICES) takes cuda:0. A numbered GPU
    among several would put every rank on it, and more ranks than GPUs would share some: both refused
    on every rank, before any joins. Ranks that still share a GPU are refused after joining
    (`refuse_shared_gpus`), as one visible GPU per rank cannot be told apart from one GPU in all.
    """
    if not device.startswith("cuda"):
        return device
    if local_ranks == 1 or visible_gpus == 1:
        return "cuda:0" if device == "cuda" else device
    if device != "cuda":
        raise ValueError(f"--device {device} would put all {local_ranks} torchrun ranks of this machine on one GPU; "
                         "pass --device cuda and each rank takes cuda:LOCAL_RANK (choose the GPUs with "
                         "CUDA_VISIBLE_DEVICES)")
    if local_ranks > visible_gpus:
        raise ValueError(f"{local_ranks} torchrun ranks on this machine but {visible_gpus} GPUs visible: start at most "
                         f"{visible_gpus} ranks per machine (--nproc-per-node), or make more GPUs visible")
    return f"cuda:{local_rank}"


def refuse_shared_gpus(gpus: list[str]) -> None:
    """Each rank's GPU (host and UUID, in rank order) must be its own: two ranks on one GPU would
    compete for its memory and NCCL refuses them with a message that does not say why."""
    seen: dict[str, list[int]] = {}
    for r, gpu in enumerate(gpus):
        seen.setdefault(gpu, []).append(r)
    shared = [ranks for ranks in seen.values() if len(ranks) > 1]
    if shared:
        raise ValueError(f"torchrun ranks {', '.join('/'.join(map(str, ranks)) for ranks in shared)} share one GPU: "
                         "start one rank per GPU (--nproc-per-node at most the GPUs each machine has)")


def _gpu_identity(device: str) -> str:
    props = torch.cuda.get_device_properties(torch.device(device))
    return f"{socket.gethostname()}:{getattr(props, 'uuid', device)}"


def setup(device: str, timeout_s: float = 3600.0) -> str:
    """Join the process group when started by torchrun; returns the device this rank should use
    (`rank_device`). A plain run on a numbered GPU makes it the current one, so that waits for
    queued work (`phases.wait_for_gpus`) wait on it."""
    if "WORLD_SIZE" not in os.environ:  # not started by torchrun
        if device.startswith("cuda:"):
            torch.cuda.set_device(torch.device(device))
        return device
    local_ranks = int(os.environ.get("LOCAL_WORLD_SIZE", os.environ["WORLD_SIZE"]))
    visible = torch.cuda.device_count() if device.startswith("cuda") else 0
    device = rank_device(device, int(os.environ.get("LOCAL_RANK", "0")), local_ranks, visible)
    on_cuda = device.startswith("cuda")
    if on_cuda:
        torch.cuda.set_device(torch.device(device))
    if not dist.is_initialized():
        backend = "cpu:gloo,cuda:nccl" if on_cuda else "gloo"
        dist.init_process_group(backend, timeout=timedelta(seconds=timeout_s))
        dist.barrier()  # one real collective, also at world size 1 (on gloo: barriers take the CPU backend)
        if on_cuda:  # and one on a CUDA tensor, the only kind NCCL carries (objects and barriers go over gloo)
            gpus: list[Any] = [None] * dist.get_world_size()
            dist.all_gather_object(gpus, _gpu_identity(device))
            refuse_shared_gpus(gpus)
            probe = torch.ones(1, device=device)
            dist.all_reduce(probe)
            _COLLECTIVES["cuda_all_reduce"] = int(probe.item()) == dist.get_world_size()
    signal.signal(signal.SIGTERM, _stop)
    return device


_COLLECTIVES: dict[str, bool] = {}  # collectives that ran at setup, beyond the barrier, and whether they agreed


def group_info() -> dict[str, Any] | None:
    """The process group this run joined (backend, world size), for run.json; None outside torchrun."""
    if not dist.is_available() or not dist.is_initialized():
        return None
    return {"backend": str(dist.get_backend()), "world_size": dist.get_world_size(), "barrier": True, **_COLLECTIVES}


def _ensure_group() -> None:
    if not dist.is_initialized():
        setup("cpu")


def shard_layers(n_layers: int, size: int | None = None, index: int | None = None) -> list[int]:
    """Start layers rank `index` of `size` profiles, balanced by replay cost ∝ (L − l + 1). Sorted."""
    return shard_entries(list(range(n_layers)), [1] * n_layers, n_layers, size, index)


def shard_entries(layers: list[int], counts: list[int], n_layers: int, size: int | None = None,
                  index: int | None = None) -> list[int]:
    """The layers of `layers` (each with counts[i] entries to replay) rank `index` of `size` measures,
    balanced by replay cost ∝ entries × (L − l + 1): the auto profiler's exact rounds split over ranks."""
    size = world_size() if size is None else size
    index = rank() if index is None else index
    load = [0] * size
    owned: list[list[int]] = [[] for _ in range(size)]
    for layer, count in sorted(zip(layers, counts, strict=True), key=lambda pair: -pair[1] * (n_layers - pair[0] + 1)):
        target = min(range(size), key=lambda r: (load[r], r))
        owned[target].append(layer)
        load[target] += count * (n_layers - layer + 1)
    return sorted(owned[index])


def all_gather(value: Any) -> list[Any]:
    """Every rank's `value`, in rank order (just [value] outside torchrun)."""
    if world_size() == 1:
        return [value]
    _ensure_group()
    parts: list[Any] = [None] * world_size()
    dist.all_gather_object(parts, value)
    return parts


def gather_table(table: LossTable, layers: list[int]) -> LossTable:
    """The full table on every rank, from each rank's table of its own `layers` (the other rows are 0)."""
    if world_size() == 1:
        return table
    assert table.exact is not None
    rows = {layer: {c: table.loss[c][layer].tolist() for c in table.loss} for layer in layers}
    meta = {"layers": layers, "wall_s": table.meta.get("wall_s"), "layer_wall_s": table.meta.get("layer_wall_s", {})}
    parts = all_gather((rows, meta))
    merged = table.copy()
    walls: dict[str, Any] = {}
    for part_rows, _ in parts:
        for layer, row in part_rows.items():
            for c, values in row.items():
                merged.loss[c][int(layer)] = np.asarray(values, dtype=np.float64)
    for _, part_meta in parts:
        walls.update({str(k): v for k, v in part_meta["layer_wall_s"].items()})
    merged.meta.update({"world_size": world_size(), "layer_wall_s": walls,
                        "rank_layers": [part_meta["layers"] for _, part_meta in parts],
                        "rank_wall_s": [part_meta["wall_s"] for _, part_meta in parts]})
    return merged
