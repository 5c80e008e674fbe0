"""The vLLM plugin serves heterogeneous pruned folders of every family exactly as transformers runs them."""

from __future__ import annotations

import json
import subprocess

import pytest
import torch

from gapprune.export.save import save
from gapprune.models import get_adapter
from gapprune.serving.vllm_plugin import ARCHITECTURES
from gapprune.serving.vllm_runtime import check_servable, engine_env, not_divisible, run_job
from tests.conftest import FAMILIES
from tests.serving.conftest import servable_tiny


def pruned_with_biases(family: str) -> torch.nn.Module:
    """Per-layer head counts and widths, a layer without attention, one without MLP, and the output
    biases compensation adds (random, so that a bias lost on the way shows in the logits)."""
    model = servable_tiny(family)
    adapter = get_adapter(model)
    groups = model.config.num_key_value_heads
    adapter.prune_attention_(0, [0] if groups > 1 else [0, 1])
    adapter.prune_mlp_(0, list(range(0, 128, 2)))
    adapter.prune_attention_(1, [])
    adapter.prune_mlp_(2, [])
    adapter.prune_mlp_(3, list(range(40)))
    adapter.record_shapes_()
    torch.manual_seed(5)
    for layer_index in (0, 3):
        layer = model.model.layers[layer_index]
        for block, name in ((layer.self_attn, "o_proj"), (layer.mlp, "down_proj")):
            old = getattr(block, name)
            new = torch.nn.Linear(old.in_features, old.out_features, bias=True)
            with torch.no_grad():
                new.weight.copy_(old.weight)
                new.bias.normal_(0, 0.5)
            setattr(block, name, new)
        shape = model.config.layer_shapes[layer_index]
        shape["attn_out_bias"] = shape["mlp_out_bias"] = True
    return model.eval()


@pytest.fixture(scope="module")
def served(vllm_env, tmp_path_factory):
    """Every family's pruned folder, its transformers log-probabilities and greedy tokens, and vLLM's answers
    for the same prompts, all vLLM engines in one process."""
    root = tmp_path_factory.mktemp("vllm_families")
    prompts = torch.randint(0, 256, (3, 20), generator=torch.Generator().manual_seed(3))
    expected, jobs = {}, []
    for family in sorted(FAMILIES):
        model = pruned_with_biases(family)
        with torch.inference_mode():
            logprobs = torch.log_softmax(model(input_ids=prompts).logits.float(), -1)
            greedy = model.generate(prompts, max_new_tokens=8, do_sample=False, pad_token_id=0)[:, prompts.shape[1]:]
        wanted = logprobs[:, :-1].gather(-1, prompts[:, 1:, None])[..., 0]
        expected[family] = (wanted, greedy.tolist())
        folder = save(model, None, root / family)
        jobs.append({"model": str(folder), "dtype": "float32", "enforce_eager": True, "max_model_len": 64,
                     "skip_tokenizer_init": True, "tasks": [
                         {"kind": "prompt_logprobs", "windows": prompts.tolist()},
                         {"kind": "generate", "prompts": prompts.tolist(), "max_tokens": 8}]})
    # in-process engines with a small KV cache: the same model code, half the start-up
    answers = run_job(vllm_env, {"jobs": jobs, "env": engine_env(1, in_process=True)})
    return expected, dict(zip(sorted(FAMILIES), answers))


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_vllm_gives_transformers_logprobs_and_greedy_tokens(served, family):
    expected, answers = served
    wanted, greedy = expected[family]
    logprobs, generated = answers[family]["results"]
    assert torch.allclose(torch.tensor(logprobs["logprobs"]), wanted, atol=2e-4, rtol=0), family
    assert generated["tokens"] == greedy


def test_vllm_plugin_registers_every_pruned_architecture_without_importing_torch(vllm_env):
    probe = (
        "import sys, gapprune.serving.vllm_plugin\n"
        "assert 'torch' not in sys.modules, 'the entry point imported torch'\n"
        "from vllm import ModelRegistry\n"
        "from vllm.plugins import load_general_plugins\n"
        "load_general_plugins()\n"
        "import json; print(json.dumps(sorted(ModelRegistry.get_supported_archs())))\n"
    )
    done = subprocess.run([vllm_env.python, "-c", probe], capture_output=True, text=True, check=True)
    supported = set(json.loads(done.stdout.strip().splitlines()[-1]))
    assert set(ARCHITECTURES) <= supported


def test_vllm_refuses_folders_it_cannot_serve(tmp_path, llama):
    with pytest.raises(ValueError, match="no config.json"):
        check_servable(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["BertModel"]}))
    with pytest.raises(ValueError, match="BertModel"):
        check_servable(tmp_path)
    adapter = get_adapter(llama)
    adapter.prune_mlp_(0, list(range(63)))  # 63 channels: not divisible by 2
    adapter.record_shapes_()
    folder = save(llama, None, tmp_path / "pruned")
    assert check_servable(folder)["architectures"] == ["GapprunedLlamaForCausalLM"]
    with pytest.raises(ValueError, match="cannot be sharded over 2 ranks: layers \\[0\\]"):
        check_servable(folder, tensor_parallel=2)


def test_kv_heads_fewer_than_ranks_are_replicated_not_refused():
    shape = {"num_attention_heads": 4, "num_key_value_heads": 1, "intermediate_size": 64}
    assert not_divisible([shape], 2) == []
    assert not_divisible([{**shape, "num_key_value_heads": 3, "num_attention_heads": 6}], 2) == [0]
    assert not_divisible([{**shape, "intermediate_size": 63}], 2) == [0]


def test_a_plan_pruned_for_two_ranks_serves_over_two_ranks_as_transformers_runs_it(vllm_env, tmp_path):
    """Kept heads and channels that split over 2 ranks (what `--tp 2` plans), served with tensor parallelism 2
    (on a CPU: one core per rank, `engine_env`): transformers' greedy tokens and log-probabilities."""
    model = servable_tiny("llama")
    adapter = get_adapter(model)
    adapter.prune_attention_(0, [0, 1])  # one KV group of two query heads: the KV head is replicated over ranks
    adapter.prune_mlp_(1, list(range(0, 128, 2)))
    adapter.prune_attention_(2, [])
    adapter.record_shapes_()
    folder = save(model, None, tmp_path / "tp2")
    check_servable(folder, tensor_parallel=2)
    prompts = torch.randint(0, 256, (2, 16), generator=torch.Generator().manual_seed(4))
    with torch.inference_mode():
        logprobs = torch.log_softmax(model(input_ids=prompts).logits.float(), -1)
        greedy = model.generate(prompts, max_new_tokens=6, do_sample=False, pad_token_id=0)[:, prompts.shape[1]:]
    wanted = logprobs[:, :-1].gather(-1, prompts[:, 1:, None])[..., 0]
    answer = run_job(vllm_env, {
        "model": str(folder), "dtype": "float32", "enforce_eager": True, "max_model_len": 64,
        "skip_tokenizer_init": True, "tensor_parallel_size": 2, "env": engine_env(1, tensor_parallel=2),
        "tasks": [{"kind": "prompt_logprobs", "windows": prompts.tolist()},
                  {"kind": "generate", "prompts": prompts.tolist(), "max_tokens": 6}]})
    served_logprobs, generated = answer["results"]
    assert answer["tensor_parallel_size"] == 2  # the engine's own word that it ran two ranks
    assert torch.allclose(torch.tensor(served_logprobs["logprobs"]), wanted, atol=2e-4, rtol=0)
    assert generated["tokens"] == greedy.tolist()


def test_each_rank_gets_its_own_cores(monkeypatch):
    monkeypatch.delenv("VLLM_CPU_OMP_THREADS_BIND", raising=False)
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: {0, 1, 2, 3})
    assert engine_env(2, tensor_parallel=2)["VLLM_CPU_OMP_THREADS_BIND"] == "0,1|2,3"
    assert "VLLM_CPU_OMP_THREADS_BIND" not in engine_env(2)
    assert engine_env(1, in_process=True) == {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
