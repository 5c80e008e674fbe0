"""HumanEval generated in vLLM: transformers' greedy text, cut as the scorer cuts it, with vLLM's bar on our stderr."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from gapprune.data.text import bos_token_id
from gapprune.evaluate.humaneval import load_problems, truncate_at_stop

GENERATE = """
import json, sys
from transformers import AutoTokenizer
from gapprune.evaluate.humaneval import generate_completions_vllm, load_problems
folder, data, vllm_python, *ids = sys.argv[1:]
problems = [p for p in load_problems(data) if p.task_id in ids]
print(json.dumps(generate_completions_vllm(folder, AutoTokenizer.from_pretrained(folder), problems,
                                           vllm_python=vllm_python, max_new_tokens=12)))
"""


def test_humaneval_completions_from_vllm_are_transformers_greedy_ones_with_progress_shown(
        vllm_env, servable_folder, data_dir: Path) -> None:
    folder, _ = servable_folder
    tokenizer = AutoTokenizer.from_pretrained(folder)
    # the three shortest prompts: the tiny model reads 256 positions
    problems = sorted(load_problems(data_dir), key=lambda p: len(tokenizer(p.prompt)["input_ids"]))[:3]
    model = AutoModelForCausalLM.from_pretrained(folder).eval()
    bos = bos_token_id(tokenizer)
    expected = {}
    for problem in problems:  # one prompt at a time, no stop strings: the reference the served text must equal
        ids = ([bos] if bos is not None else []) + tokenizer(problem.prompt, add_special_tokens=False)["input_ids"]
        with torch.no_grad():
            out = model.generate(torch.tensor([ids]), max_new_tokens=12, do_sample=False, pad_token_id=0)
        # the continuation's text in the prompt's context, as vLLM detokenizes it (here a leading space)
        whole, prompt = (tokenizer.decode(t, skip_special_tokens=True) for t in (out[0], ids))
        assert whole.startswith(prompt)
        expected[problem.task_id] = truncate_at_stop(whole[len(prompt):])
    # a process of its own whose stderr is fd 2, as a user's is: the bar must reach it past the worker's log
    done = subprocess.run([sys.executable, "-c", GENERATE, str(folder), str(data_dir), vllm_env.python,
                           *(p.task_id for p in problems)], capture_output=True, text=True, check=True)
    served = json.loads(done.stdout.strip().splitlines()[-1])
    assert served == expected and any(served.values())  # something was written, the same text
    assert "Processed prompts" in done.stderr and "3/3" in done.stderr
    assert "INFO" not in done.stderr  # vLLM's log stays in its file


FAKE_WORKER = """#!/bin/sh
# stands in for vLLM's interpreter: `-m gapprune.serving.vllm_worker JOB OUT`
echo "INFO a line of vLLM's log" >&2
echo "Processed prompts: 3/3" >&$GAPPRUNE_PROGRESS_FD
echo '{"results": []}' > "$4"
"""

RUN_JOB = """
import sys
from gapprune.serving.vllm_runtime import VllmEnvironment, run_job
print(run_job(VllmEnvironment(sys.argv[1], "0.32.0"), {"model": "m", "tasks": []}))
"""


def test_the_worker_draws_progress_on_our_stderr_and_logs_elsewhere_even_when_our_stderr_is_fd_2(tmp_path: Path):
    fake = tmp_path / "python"
    fake.write_text(FAKE_WORKER)
    fake.chmod(0o755)
    done = subprocess.run([sys.executable, "-c", RUN_JOB, str(fake)], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "{'results': []}"
    assert "Processed prompts: 3/3" in done.stderr and "INFO" not in done.stderr
