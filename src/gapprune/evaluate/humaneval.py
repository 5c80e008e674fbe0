"""HumanEval pass@1: does the pruned model still write Python that runs and passes the tests?

Generation and scoring are separate steps, so a scorer test needs no model. Scoring runs code a model
wrote: each program (prompt + completion + the problem's tests + `check(entry_point)`) runs in its own
`python -I` process, in a fresh temporary folder, in its own process group (killed whole at the time
limit), with stdin closed and its address space capped. That is a guard against accidents (an endless
loop, a runaway list, a stray file), not a sandbox against code written to escape.

Prompt styles are a table (`STYLES`): `plain` gives the prompt as text to continue and cuts the
continuation at the usual stop sequences, as the HumanEval paper did. A chat style for instruct models
(ask in chat form, pull the code block out of the answer) is one more entry.
"""

from __future__ import annotations

import gzip
import json
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tqdm.auto import tqdm

from gapprune.data.sources import DATA_ENV
from gapprune.data.sources import data_dir as resolve_data_dir

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

PROBLEMS_FILE = "humaneval/HumanEval.jsonl.gz"  # relative to the data folder
STOP_SEQUENCES = ("\ndef ", "\nclass ", "\nif __name__", "\nprint(", "\n#")
TIMEOUT_S = 10.0  # per program; the paper's harness used 3 s, raised for a shared, busy CPU
MEMORY_LIMIT_BYTES = 2 << 30  # address space of one program: a runaway list fails it, not the host
WORKERS = 2  # programs run at once


@dataclass(frozen=True)
class Problem:
    """One HumanEval task, as the data file holds it."""

    task_id: str
    prompt: str
    entry_point: str
    canonical_solution: str
    test: str


@dataclass(frozen=True)
class TaskResult:
    """How one completion fared. `reason`: None when it passed, else "error" (a failed assertion, an
    exception, a syntax error) or "timeout"; `detail`: the last line the program wrote to stderr."""

    task_id: str
    passed: bool
    reason: str | None
    detail: str
    completion: str


@dataclass(frozen=True)
class HumanEvalResult:
    """Per-task results, in problem order, and pass@1 over them (one greedy completion per task)."""

    results: tuple[TaskResult, ...]

    @property
    def passed(self) -> int:
        return sum(r.passed for r in self.results)

    @property
    def pass_at_1(self) -> float:
        return self.passed / len(self.results) if self.results else float("nan")

    def to_record(self, limit: int | None = None) -> dict[str, Any]:
        """The summary in the shape of `gapprune eval`'s other records."""
        return {"task": "humaneval", "metric": "pass@1", "value": self.pass_at_1, "passed": self.passed,
                "n": len(self.results), "limit": limit}

    def task_rows(self) -> list[dict[str, Any]]:
        """One JSON-ready row per task: what was written and why it failed, for reading the failures."""
        return [asdict(r) for r in self.results]


def load_problems(data_directory: str | Path | None = None) -> list[Problem]:
    """The 164 problems from `<data folder>/humaneval/HumanEval.jsonl.gz`, in task order."""
    folder = resolve_data_dir(data_directory)
    if folder is None:
        raise FileNotFoundError(f"HumanEval reads {PROBLEMS_FILE} from the data folder: set --data-dir or ${DATA_ENV}")
    path = folder / PROBLEMS_FILE
    if not path.is_file():
        raise FileNotFoundError(f"HumanEval needs {path} (the data folder from --data-dir or ${DATA_ENV})")
    with gzip.open(path, "rt", encoding="utf-8") as handle:
        rows = [json.loads(line) for line in handle if line.strip()]
    return [Problem(**{k: row[k] for k in Problem.__dataclass_fields__}) for row in rows]


def program(problem: Problem, completion: str) -> str:
    """The text that is run: the prompt, the completion, the tests, and the call that runs them."""
    return f"{problem.prompt}{completion}\n\n{problem.test}\n\ncheck({problem.entry_point})\n"


def _guard(memory_bytes: int | None) -> str:
    """Lines run before the program: cap its address space (POSIX; nothing elsewhere)."""
    if memory_bytes is None:
        return ""
    return ("try:\n    import resource as _resource\n"
            f"    _resource.setrlimit(_resource.RLIMIT_AS, ({memory_bytes}, {memory_bytes}))\n"
            "except (ImportError, ValueError, OSError):\n    pass\n")


def _kill_group(pid: int) -> None:
    """Kill the program and anything it started (they share its process group)."""
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass  # already gone


def check(problem: Problem, completion: str, timeout_s: float = TIMEOUT_S,
          memory_bytes: int | None = MEMORY_LIMIT_BYTES) -> TaskResult:
    """Run one completion against its problem's tests in a fresh folder and process, with a time limit."""
    with tempfile.TemporaryDirectory(prefix="gapprune-humaneval-") as folder, tempfile.TemporaryFile() as stderr:
        (Path(folder) / "program.py").write_text(_guard(memory_bytes) + program(problem, completion), encoding="utf-8")
        proc = subprocess.Popen(
            [sys.executable, "-I", "program.py"], cwd=folder, stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL, stderr=stderr, start_new_session=True,  # a file, not a pipe: never blocks
        )
        try:
            code = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            code = None
        finally:
            _kill_group(proc.pid)  # on time-out, and any child the program left running
            proc.wait()
        stderr.seek(0)
        lines = stderr.read()[-4096:].decode("utf-8", "replace").strip().splitlines()
    detail = lines[-1] if lines else ""
    if code is None:
        return TaskResult(problem.task_id, False, "timeout", f"no result in {timeout_s:g} s", completion)
    return TaskResult(problem.task_id, code == 0, None if code == 0 else "error", detail, completion)


def score(completions: Mapping[str, str], problems: Sequence[Problem], *, timeout_s: float = TIMEOUT_S,
          workers: int = WORKERS, progress: bool = True) -> HumanEvalResult:
    """pass@1 of one completion per problem, `workers` programs at a time.

    The pool is threads: each only waits on its program's own process, so nothing forks this
    process (which may hold a model in memory)."""
    missing = [p.task_id for p in problems if p.task_id not in completions]
    if missing:
        raise KeyError(f"no completion for {len(missing)} problems, e.g. {missing[0]}")
    with ThreadPoolExecutor(max_workers=workers) as pool:
        runs = pool.map(lambda p: check(p, completions[p.task_id], timeout_s), problems)
        results = tuple(tqdm(runs, total=len(problems), desc="humaneval tests", unit="task", disable=not progress))
    return HumanEvalResult(results)


def truncate_at_stop(text: str, stops: Sequence[str] = STOP_SEQUENCES) -> str:
    """The completion up to the first stop sequence: the function body, not what the model writes next."""
    cut = min((i for i in (text.find(s) for s in stops) if i >= 0), default=len(text))
    return text[:cut]


@dataclass(frozen=True)
class PromptStyle:
    """How a problem is put to the model and how its answer becomes a completion of the prompt."""

    prompt: Callable[[Problem, PreTrainedTokenizerBase], str]
    extract: Callable[[Problem, str], str]
    stops: tuple[str, ...]  # generation may stop once all of a batch's answers hold one


STYLES: dict[str, PromptStyle] = {
    "plain": PromptStyle(prompt=lambda problem, tokenizer: problem.prompt,
                         extract=lambda problem, text: truncate_at_stop(text), stops=STOP_SEQUENCES),
}


def _left_padded(rows: list[list[int]], pad_id: int) -> tuple[list[list[int]], list[list[int]]]:
    """Token rows padded on the left to one length, and their attention masks."""
    width = max(len(r) for r in rows)
    return [[pad_id] * (width - len(r)) + r for r in rows], [[0] * (width - len(r)) + [1] * len(r) for r in rows]


def continuation(tokenizer: PreTrainedTokenizerBase, prompt: list[int], new: list[int]) -> str:
    """The text `new` adds after `prompt`, decoded in the prompt's context (as vLLM detokenizes): decoded alone, a
    SentencePiece tokenizer (Llama 2, Mistral, Gemma) drops the first token's leading space, so a body indented by
    four spaces would come back indented by three."""
    before = str(tokenizer.decode(prompt, skip_special_tokens=True))
    whole = str(tokenizer.decode(prompt + new, skip_special_tokens=True))
    return whole[len(before):] if whole.startswith(before) else str(tokenizer.decode(new, skip_special_tokens=True))


def generate_completions(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, problems: Sequence[Problem], *,
    style: str = "plain", max_new_tokens: int = 384, batch_size: int = 8, progress: bool = True,
) -> dict[str, str]:
    """Greedy completions {task_id: completion}, in batches of similar prompt length, padded on the left.

    Prompts are encoded without special tokens, BOS first for models that expect it (`bos_token_id`,
    as perplexity windows are), so no tokenizer setting is changed."""
    import torch
    from transformers import GenerationMixin

    from gapprune.data.text import bos_token_id

    if not isinstance(model, GenerationMixin):
        raise TypeError(f"{type(model).__name__} cannot generate text, so it cannot be scored on HumanEval")
    if style not in STYLES:
        raise ValueError(f"unknown prompt style {style!r}; choose from {', '.join(STYLES)}")
    spec, bos = STYLES[style], bos_token_id(tokenizer)
    pad_id = next((int(t) for t in (tokenizer.pad_token_id, tokenizer.eos_token_id) if t is not None), 0)
    prompts = {p.task_id: spec.prompt(p, tokenizer) for p in problems}
    encoded = {k: ([bos] if bos is not None else []) + tokenizer(v, add_special_tokens=False)["input_ids"]
               for k, v in prompts.items()}
    order = sorted(problems, key=lambda p: len(encoded[p.task_id]))  # less padding per batch
    completions: dict[str, str] = {}
    bar = tqdm(total=len(order), desc="humaneval generation", unit="task", disable=not progress)
    for start in range(0, len(order), batch_size):
        batch = order[start : start + batch_size]
        ids, mask = _left_padded([encoded[p.task_id] for p in batch], pad_id)
        input_ids = torch.tensor(ids, device=model.device)  # (b, T)
        with torch.no_grad():
            out = model.generate(
                input_ids=input_ids, attention_mask=torch.tensor(mask, device=model.device),
                max_new_tokens=max_new_tokens, do_sample=False, pad_token_id=pad_id,
                stop_strings=list(spec.stops), tokenizer=tokenizer,
            )  # (b, T + new)
        for problem, row in zip(batch, out[:, input_ids.shape[1] :].tolist(), strict=True):
            completions[problem.task_id] = spec.extract(problem, continuation(tokenizer, encoded[problem.task_id], row))
        bar.update(len(batch))
    bar.close()
    return {p.task_id: completions[p.task_id] for p in problems}  # problem order


def generate_completions_vllm(
    folder: str | Path, tokenizer: PreTrainedTokenizerBase, problems: Sequence[Problem], *, vllm_python: str | None = None,
    style: str = "plain", max_new_tokens: int = 384,
) -> dict[str, str]:
    """The same greedy completions as `generate_completions`, generated by vLLM serving `folder` (all problems
    in one batch, which is what vLLM is for; the prompts are encoded here exactly as there)."""
    from gapprune.data.text import bos_token_id
    from gapprune.serving.vllm_runtime import (
        SERVING_KV_CACHE_GIB,
        check_servable,
        engine_env,
        find_vllm,
        run_job,
    )

    env = find_vllm(vllm_python)
    check_servable(folder)
    spec, bos = STYLES[style], bos_token_id(tokenizer)
    prompts = [([bos] if bos is not None else []) + tokenizer(spec.prompt(p, tokenizer), add_special_tokens=False)[
        "input_ids"] for p in problems]
    longest = max(len(p) for p in prompts) + max_new_tokens
    job = {"model": str(folder), "dtype": "float32",  # as gapprune evaluates on a CPU
           "enforce_eager": True, "max_model_len": longest, "env": engine_env(SERVING_KV_CACHE_GIB),
           "tasks": [{"kind": "generate", "prompts": prompts, "max_tokens": max_new_tokens,
                      "stop": list(spec.stops), "progress": True}]}
    texts = run_job(env, job)["results"][0]["texts"]
    return {p.task_id: spec.extract(p, text) for p, text in zip(problems, texts, strict=True)}


def evaluate_humaneval(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, *, data_directory: str | Path | None = None,
    limit: int | None = None, batch_size: int | None = None, timeout_s: float = TIMEOUT_S, style: str = "plain",
) -> HumanEvalResult:
    """Generate for the first `limit` problems (all when None), then score: what `gapprune eval --tasks
    humaneval` runs."""
    problems = load_problems(data_directory)[:limit]
    completions = generate_completions(model, tokenizer, problems, style=style, batch_size=batch_size or 8)
    return score(completions, problems, timeout_s=timeout_s)
