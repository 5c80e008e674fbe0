"""What the benchmarks share: settings, flags, resumable result files, the dense profile, perplexity.

Change a number here and every benchmark and `render.py` follow; the records in docs/results/ were
measured with these values. Every plan-comparing study calibrates with `bench_config` and reuses
one dense profile folder (`PROFILE`), so their loss tables, scores and signals are the same numbers.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
from datetime import date
from pathlib import Path
from typing import Any, NamedTuple

import torch

MODEL = "smollm2-135m"
GAPPRUNE = str(Path(sys.executable).with_name("gapprune"))  # the CLI of this environment, run as a user runs it
PROFILE = "runs/bench_profile"  # the dense exact profile the SmolLM2 studies reuse (written by the first)
# Calibration: 32 windows x 128 tokens of WikiText-2 validation for statistics, the first 4 (512 tokens) for ΔL.
CALIBRATION: dict[str, Any] = {"criterion": "activation", "metric": "kl", "calib": "wikitext2", "calib_split": "validation",
                               "calib_samples": 32, "profile_samples": 4, "seq_len": 128, "batch_size": 4, "mlp_stride": 4}
ALLOCATORS = ["gap", "uniform", "global", "depth", "owl"]
RATIOS = [0.125, 0.25, 0.375, 0.5]
DATASETS = ["wikitext2", "ptb"]
TASKS = ["boolq", "piqa", "hellaswag", "winogrande", "arc_easy", "arc_challenge", "openbookqa"]


class Window(NamedTuple):
    """Which perplexity: the first `windows` windows of `seq_len` tokens (None: all) of a split."""

    dataset: str
    seq_len: int = 128
    windows: int | None = 256  # first windows of each test split: the numbers quoted in the README
    split: str | None = None  # None: the set's evaluation split (test; validation for c4)


# The allocator comparison: WikiText-2 and PTB at 128 tokens, WikiText-2 at 2048.
ALLOCATOR_WINDOWS = [Window("wikitext2"), Window("ptb"), Window("wikitext2", 2048, 16)]


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


def perplexity(model: torch.nn.Module, tokenizer: Any, window: Window, data_dir: str | None) -> dict[str, Any]:
    """One perplexity as a flat record (dataset, split, seq_len, windows, tokens, ppl, wall_s, bos, ...)."""
    from gapprune.evaluate.perplexity import evaluate_ppl

    return evaluate_ppl(model, tokenizer, window.dataset, split=window.split, seq_len=window.seq_len,
                        max_windows=window.windows, data_dir=data_dir).to_record()


@torch.inference_mode()
def reload_check(model: torch.nn.Module, folder: Path, tokenizer: Any) -> dict[str, Any]:
    """Logits and greedy text of the saved folder, loaded both ways, against the in-memory pruned model."""
    from transformers import AutoModelForCausalLM

    from gapprune.api import load

    ids = tokenizer("The capital of France is", return_tensors="pt").input_ids
    expected, text = model(input_ids=ids).logits, model.generate(ids, max_new_tokens=8, do_sample=False)
    result = {}
    for way, loaded in (("gapprune.load", load(str(folder))[0]),
                        ("from_pretrained(trust_remote_code=True)",
                         AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True).eval())):
        result[way] = {"identical_logits": bool(torch.equal(loaded(input_ids=ids).logits, expected)),
                       "identical_greedy_tokens": bool(torch.equal(loaded.generate(ids, max_new_tokens=8,
                                                                                   do_sample=False), text))}
    return {"reload": result, "params": sum(p.numel() for p in model.parameters())}
