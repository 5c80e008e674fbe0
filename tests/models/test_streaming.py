"""A model streamed from disk (one decoder layer resident) prunes and saves like the in-memory one."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

from gapprune.api import load
from gapprune.cli import main
from gapprune.models.streaming import open_streamed, streamer_of

IDS = torch.arange(48).view(2, 24) % 250


def prune_argv(folder: Path, text: Path, out: Path, *extra: str) -> list[str]:
    return ["prune", str(folder), "--ratio", "0.3", "--out", str(out), "--calib", str(text), "--calib-samples", "4",
            "--profile-samples", "4", "--seq-len", "32", "--batch-size", "2", "--channel-step", "32", "--no-plots",
            *extra]


def test_a_streamed_model_keeps_one_layer_and_gives_the_same_logits(tiny_model_folder, tmp_path):
    folder, _ = tiny_model_folder
    dense, _ = load(str(folder))
    streamed = open_streamed(folder, scratch_dir=tmp_path)
    streamer = streamer_of(streamed)
    assert streamer is not None and not streamer.resident
    assert all(p.is_meta for p in streamer.layers._modules["2"].parameters())
    with torch.inference_mode():
        torch.testing.assert_close(streamed(input_ids=IDS).logits, dense(input_ids=IDS).logits)
    assert list(streamer.resident) == [3]  # after a forward only the last layer is resident
    streamed.model.layers[1]
    assert list(streamer.resident) == [1] and not any(p.is_meta for p in streamer.layers._modules["1"].parameters())


def test_streamed_prune_and_save_reload_to_the_in_memory_logits(tiny_model_folder, tmp_path, monkeypatch):
    from transformers import AutoModelForCausalLM

    folder, text = tiny_model_folder
    monkeypatch.setenv("GAPPRUNE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    assert main(prune_argv(folder, text, tmp_path / "memory", "--offload", "off")) == 0
    assert main(prune_argv(folder, text, tmp_path / "streamed", "--offload", "on")) == 0
    memory, streamed = tmp_path / "memory", tmp_path / "streamed"
    for name in ("plan.json",):
        assert json.loads((memory / name).read_text())["layers"] == json.loads((streamed / name).read_text())["layers"]
    table = json.loads((streamed / "loss_table.json").read_text())
    assert table["meta"]["traversal"] == "layer_major"
    index = json.loads((streamed / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) == 5  # one shard per decoder layer, one for the rest
    a, _ = load(str(memory))
    b, _ = load(str(streamed))
    remote = AutoModelForCausalLM.from_pretrained(streamed, trust_remote_code=True)
    with torch.inference_mode():
        expected = a(input_ids=IDS).logits
        torch.testing.assert_close(b(input_ids=IDS).logits, expected, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(remote(input_ids=IDS).logits, expected, rtol=1e-4, atol=1e-5)
    sys.modules.pop("transformers_modules", None)
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(("gapprune-", "."))) == []


def test_streamed_runs_refuse_what_needs_every_layer(tiny_model_folder, tmp_path, capsys):
    folder, text = tiny_model_folder
    assert main(prune_argv(folder, text, tmp_path / "o", "--offload", "on", "--profiler", "fisher")) == 2
    assert "set profiler to auto or exact" in capsys.readouterr().err and not (tmp_path / "o").exists()


def test_offload_auto_streams_only_what_would_not_fit(tiny_model_folder, monkeypatch):
    from gapprune.models import streaming
    from gapprune.models.streaming import policy

    folder, _ = tiny_model_folder
    size = streaming.weights_bytes(folder)
    assert size == sum(p.numel() for p in load(str(folder))[0].parameters()) * 4
    need = size + policy.working_bytes(folder)  # the whole run: weights, cached inputs, one layer's Grams and OBS
    monkeypatch.setattr(policy, "available_bytes", lambda: 4 * need)
    assert not streaming.should_stream(folder, "auto") and streaming.should_stream(folder, "on")
    monkeypatch.setattr(policy, "available_bytes", lambda: need)
    assert streaming.should_stream(folder, "auto") and not streaming.should_stream(folder, "off")
    assert not streaming.should_stream("someone/hub-model", "auto")


def test_offload_auto_says_when_it_streams_why_and_how_to_keep_the_model_in_memory(tiny_model_folder, monkeypatch,
                                                                                   caplog):
    """Streaming changes the profiler and its cost; a user who did not ask for it is told, with the flag."""
    from gapprune.models.streaming import is_streamed, policy

    folder, _ = tiny_model_folder
    need, _ = policy.memory_need(folder)
    monkeypatch.setattr(policy, "available_bytes", lambda: need)  # half of it is free: under the rule, it streams
    with caplog.at_level("WARNING", logger="gapprune"):
        model, _ = load(str(folder), offload="auto")
    assert is_streamed(model)
    warning = " ".join(r.getMessage() for r in caplog.records if r.levelname == "WARNING")
    assert "offload auto" in warning and "--offload off" in warning and str(folder) in warning
    caplog.clear()
    with caplog.at_level("INFO", logger="gapprune"):
        assert is_streamed(load(str(folder), offload="on")[0])  # asked for: no warning
    assert not [r for r in caplog.records if r.levelname == "WARNING"]


def test_offload_auto_on_a_gpu_weighs_the_weights_against_the_gpus_memory(tiny_model_folder, monkeypatch):
    """Weights that fit the host but not the GPU stream; weights that fit the GPU load whole even when
    the host is short (the cached inputs, in host memory, do not decide it)."""
    from gapprune.models import streaming
    from gapprune.models.streaming import policy

    folder, _ = tiny_model_folder
    on_gpu = streaming.weights_bytes(folder) + policy.layer_work_bytes(folder)
    monkeypatch.setattr(policy, "available_bytes", lambda: 1 << 50)
    monkeypatch.setattr(policy, "device_free_bytes", lambda device: on_gpu)  # the GPU holds only half of it
    assert streaming.should_stream(folder, "auto", device="cuda:0") and not streaming.should_stream(folder, "auto")
    monkeypatch.setattr(policy, "available_bytes", lambda: 1)
    monkeypatch.setattr(policy, "device_free_bytes", lambda device: 4 * on_gpu)
    assert not streaming.should_stream(folder, "auto", device="cuda") and streaming.should_stream(folder, "auto")
