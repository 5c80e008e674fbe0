"""Zero-shot accuracy through the real lm-evaluation-harness, reading task data from local files.

The seven commonsense tasks of the LLM-Pruner tables. Where lm-eval's own task config fits our
JSONL files, the generated config `include`s it and only swaps the data source (so prompts and
metrics stay lm-eval's); HellaSwag's local file is already pre-processed, so its config is spelled out.
Reported metric per task follows LLM-Pruner: acc for BoolQ, PIQA, WinoGrande, ARC-e; acc_norm for
HellaSwag, ARC-c, OpenBookQA.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from transformers import PreTrainedModel, PreTrainedTokenizerBase

from gapprune.data.sources import data_dir as resolve_data_dir
from gapprune.evaluate.fingerprint import weights_fingerprint


@dataclass(frozen=True)
class LocalTask:
    include: str | None  # lm-eval task config to include, relative to lm_eval/tasks
    split: str
    file: str  # relative to <data>/commonsense/lm-eval
    metric: str
    extra: tuple[tuple[str, Any], ...] = ()


TASKS: dict[str, LocalTask] = {
    "boolq": LocalTask("super_glue/boolq/default.yaml", "validation", "boolq_validation.jsonl", "acc"),
    "piqa": LocalTask("piqa/piqa.yaml", "validation", "piqa_validation.jsonl", "acc"),
    "winogrande": LocalTask("winogrande/default.yaml", "validation", "winogrande_validation.jsonl", "acc"),
    "arc_easy": LocalTask("arc/arc_easy.yaml", "test", "arc_easy_test.jsonl", "acc"),
    "arc_challenge": LocalTask("arc/arc_easy.yaml", "test", "arc_challenge_test.jsonl", "acc_norm"),
    "openbookqa": LocalTask("openbookqa/openbookqa.yaml", "test", "openbookqa_test.jsonl", "acc_norm"),
    "hellaswag": LocalTask(
        None, "validation", "hellaswag_validation.jsonl", "acc_norm",
        (("output_type", "multiple_choice"), ("doc_to_text", "{{query}}"), ("doc_to_target", "{{label}}"),
         ("doc_to_choice", "choices"),
         ("metric_list", [{"metric": "acc", "aggregation": "mean", "higher_is_better": True},
                          {"metric": "acc_norm", "aggregation": "mean", "higher_is_better": True}])),
    ),
}
PREFIX = "gapprune_"


def _task_config(name: str, task: LocalTask, data_file: Path, tasks_root: Path) -> dict[str, Any]:
    config: dict[str, Any] = {
        "task": PREFIX + name,
        "dataset_path": "json",
        "dataset_name": None,
        "dataset_kwargs": {"data_files": {task.split: str(data_file)}},
        "training_split": None,
        "validation_split": task.split if task.split == "validation" else None,
        "test_split": task.split if task.split == "test" else None,
        "metadata": {"version": 1.0},
    }
    if task.include is not None:
        config["include"] = str(tasks_root / task.include)
    config.update(dict(task.extra))
    return config


def check_tasks(names: list[str]) -> None:
    """Refuse a task name this evaluation does not know, before a model loads."""
    for name in names:
        if name not in TASKS:
            raise ValueError(f"unknown task {name!r}; choose from {', '.join(TASKS)}")


def write_task_configs(names: list[str], data_directory: str | Path | None, folder: Path) -> None:
    """One YAML per task (JSON is valid YAML) in `folder`, pointing at the local data files."""
    import lm_eval

    check_tasks(names)
    tasks_root = Path(lm_eval.__file__).parent / "tasks"
    root = resolve_data_dir(data_directory)
    if root is None:
        raise FileNotFoundError("zero-shot tasks read local files: set data_dir or $GAPPRUNE_DATA")
    for name in names:
        data_file = root / "commonsense" / "lm-eval" / TASKS[name].file
        if not data_file.is_file():
            raise FileNotFoundError(f"task {name!r} needs {data_file}")
        (folder / f"{PREFIX}{name}.yaml").write_text(json.dumps(_task_config(name, TASKS[name], data_file, tasks_root)))


LOGITS_BUDGET_BYTES = 1 << 30  # float32 logits of one lm-eval batch (it holds a log-softmax copy too)
TYPICAL_TOKENS = 256  # context + continuation of the longest requests of these tasks, about


def default_batch_size(vocab_size: int) -> int:
    """Examples per lm-eval batch: 16, fewer for large vocabularies, whose (batch, tokens, vocab) logits
    would otherwise take tens of GB (Gemma 3's 262k vocabulary at 16 was killed on a 24 GB machine)."""
    return max(1, min(16, LOGITS_BUDGET_BYTES // (vocab_size * TYPICAL_TOKENS * 4)))


def zero_shot(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    tasks: list[str],
    *,
    data_directory: str | Path | None = None,
    limit: int | None = None,
    batch_size: int | None = None,
    seed: int = 0,
    resume: str | Path | None = None,
) -> list[dict[str, Any]]:
    """Accuracy per task as flat records {"task", "metric", "value", "stderr", "limit"}; `batch_size`
    None: `default_batch_size` of the model's vocabulary.

    `resume`: a folder where lm-eval keeps every answered request (its SQLite cache, one file per
    model's weights, `weights_fingerprint`), so an evaluation that was stopped starts again where it
    stopped: HellaSwag in full is 40,168 requests, hours on a CPU."""
    try:
        from lm_eval import simple_evaluate
        from lm_eval.models.huggingface import HFLM
        from lm_eval.tasks import TaskManager
    except ImportError as err:
        raise ImportError("zero-shot evaluation needs lm-eval: pip install 'gapprune[eval]'") from err
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    with tempfile.TemporaryDirectory(prefix="gapprune-tasks-") as folder:
        write_task_configs(tasks, data_directory, Path(folder))
        # each config includes lm-eval's own task file by its path, so its index of every task it ships (10 s on
        # a CPU per call, the same scores without it) is not needed
        manager = TaskManager(include_path=folder, include_defaults=False)
        batch_size = batch_size or default_batch_size(int(model.config.vocab_size))
        lm = HFLM(pretrained=model, tokenizer=tokenizer, batch_size=batch_size)
        cache = None
        if resume is not None:
            Path(resume).mkdir(parents=True, exist_ok=True)
            cache = str(Path(resume) / f"requests-{weights_fingerprint(model)}")  # lm-eval adds "_rank0.db"
        results = simple_evaluate(
            model=lm, tasks=[PREFIX + t for t in tasks], task_manager=manager, limit=limit,
            random_seed=seed, numpy_random_seed=seed, torch_random_seed=seed, fewshot_random_seed=seed,
            log_samples=False, use_cache=cache,
        )
    records = []
    for name in tasks:
        row = results["results"][PREFIX + name]
        metric = TASKS[name].metric
        records.append({
            "task": name, "metric": metric, "value": float(row[f"{metric},none"]),
            "stderr": float(row.get(f"{metric}_stderr,none", float("nan"))), "limit": limit,
        })
    return records
