from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoModelForCausalLM

import gapprune
from gapprune.export.save import save
from gapprune.models import get_adapter


def heterogeneous(model):
    """Different head counts and MLP sizes per layer, one layer without attention, one without MLP."""
    adapter = get_adapter(model)
    adapter.prune_attention_(0, [0, 2])  # 2 groups x 1 head
    adapter.prune_mlp_(0, list(range(0, 128, 2)))
    adapter.prune_attention_(1, [])  # no attention
    adapter.prune_mlp_(2, [])  # no MLP
    adapter.prune_attention_(3, [2, 3])  # 1 group x 2 heads
    adapter.record_shapes_()
    return model


def greedy(model, ids):
    with torch.inference_mode():
        return model.generate(ids, max_new_tokens=8, do_sample=False, pad_token_id=0)


def test_save_then_reload_both_ways_gives_identical_logits_and_generations(tiny_model, token_ids, tmp_path):
    model = heterogeneous(tiny_model)
    with torch.inference_mode():
        expected = model(input_ids=token_ids).logits
    expected_gen = greedy(model, token_ids[:1, :6])
    out = save(model, None, tmp_path / "pruned")
    config = json.loads((out / "config.json").read_text())
    assert config["layer_shapes"][1]["num_attention_heads"] == 0 and config["layer_shapes"][2]["intermediate_size"] == 0
    assert (out / "modeling_gapprune.py").is_file()
    assert config["architectures"] == [f"Gappruned{type(model).__name__}"], "engines pick their class by it"
    for reloaded in (
        gapprune.load(str(out))[0],
        AutoModelForCausalLM.from_pretrained(out, trust_remote_code=True).eval(),
    ):
        with torch.inference_mode():
            assert torch.equal(reloaded(input_ids=token_ids).logits, expected)
        assert torch.equal(greedy(reloaded, token_ids[:1, :6]), expected_gen)


def test_generation_with_kv_cache_matches_full_recompute(tiny_model, token_ids):
    model = heterogeneous(tiny_model)
    ids = token_ids[:1, :6]
    cached = greedy(model, ids)
    with torch.inference_mode():
        seq = ids
        for _ in range(8):
            nxt = model(input_ids=seq, use_cache=False).logits[:, -1].argmax(-1, keepdim=True)
            seq = torch.cat([seq, nxt], dim=1)
    assert torch.equal(cached, seq)


def test_existing_output_folder_is_not_overwritten(llama, tmp_path):
    (tmp_path / "out").mkdir()
    with pytest.raises(FileExistsError, match="already exists"):
        save(llama, None, tmp_path / "out")


def test_failed_save_leaves_no_folder(llama, tmp_path):
    def boom(folder):
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError, match="disk full"):
        save(llama, None, tmp_path / "out", extras=boom)
    assert list(tmp_path.iterdir()) == []


def test_truncated_weights_are_a_clear_error(llama, tmp_path):
    out = save(heterogeneous(llama), None, tmp_path / "pruned")
    weights = out / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    with pytest.raises(ValueError, match="corrupt or truncated"):
        gapprune.load(str(out))


def test_config_that_does_not_match_the_weights_is_a_clear_error(llama, tmp_path):
    out = save(heterogeneous(llama), None, tmp_path / "pruned")
    config = json.loads((out / "config.json").read_text())
    config["layer_shapes"][0]["intermediate_size"] = 100
    (out / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="config does not match|do not match its config"):
        gapprune.load(str(out))
