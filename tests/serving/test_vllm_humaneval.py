"""HumanEval generated in vLLM: transformers' greedy text, cut as the scorer cuts it, with vLLM's bar on our stderr."""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from gapprune.data.text import bos_token_id
from gapprune.evaluate.humaneval import generate_completions_vllm, load_problems, truncate_at_stop


def test_humaneval_completions_from_vllm_are_transformers_greedy_ones_with_progress_shown(
        vllm_env, servable_folder, data_dir: Path, capfd) -> None:
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
    capfd.readouterr()
    served = generate_completions_vllm(folder, tokenizer, problems, vllm_python=vllm_env.python, max_new_tokens=12)
    assert served == expected and any(served.values())  # something was written, the same text
    shown = capfd.readouterr().err
    assert "Processed prompts" in shown and "3/3" in shown  # the bar reaches the caller, vLLM's log does not
    assert "INFO" not in shown
