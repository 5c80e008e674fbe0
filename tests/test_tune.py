from __future__ import annotations

import json

import torch

import gapprune
from gapprune.export.save import save
from gapprune.models import get_adapter
from gapprune.tune import TuneConfig, lora_tune
from tests.evaluate.test_eval_bench import byte_tokenizer


def test_lora_tuning_lowers_loss_keeps_parameter_count_and_reloads(tmp_path):
    from transformers import LlamaConfig, LlamaForCausalLM

    tokenizer = byte_tokenizer()
    torch.manual_seed(0)
    config = LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, vocab_size=len(tokenizer), max_position_embeddings=512)
    config.architectures = ["LlamaForCausalLM"]
    model = LlamaForCausalLM(config).eval()
    get_adapter(model).prune_mlp_(0, list(range(40)))  # heterogeneous, like a pruned model
    get_adapter(model).record_shapes_()
    params = sum(p.numel() for p in model.parameters())
    data = tmp_path / "alpaca.json"
    data.write_text(json.dumps([{"instruction": "Say hi.", "input": "", "output": "hi hi hi"}] * 24))
    tuned, result = lora_tune(
        model, tokenizer,
        TuneConfig(data=str(data), rank=4, lr=5e-3, cutoff=64, max_steps=12, batch_size=4, val_examples=4, eval_every=6),
        checkpoint_dir=tmp_path / "ckpt",
    )
    assert result.steps == 12 and (tmp_path / "ckpt" / "trainer_state.json").is_file()
    assert sum(result.train_loss[-3:]) < sum(result.train_loss[:3])
    assert result.val_loss[-1][1] < result.val_loss[0][1]
    assert sum(p.numel() for p in tuned.parameters()) == params
    assert not any("lora" in name for name, _ in tuned.named_parameters())
    folder = save(tuned, tokenizer, tmp_path / "tuned")
    reloaded, _ = gapprune.load(str(folder))
    ids = torch.randint(0, len(tokenizer), (2, 16), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        assert torch.equal(reloaded(input_ids=ids).logits, tuned(input_ids=ids).logits)


def tiny_pruned_llama(tokenizer):  # type: ignore[no-untyped-def]
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, vocab_size=len(tokenizer), max_position_embeddings=512)
    model = LlamaForCausalLM(config).eval()
    get_adapter(model).prune_mlp_(0, list(range(40)))
    get_adapter(model).record_shapes_()
    return model


def test_lora_stopped_and_resumed_trains_exactly_as_one_run_and_refuses_other_settings(tmp_path, caplog):
    import logging

    import pytest

    tokenizer = byte_tokenizer()
    data = tmp_path / "alpaca.json"
    data.write_text(json.dumps([{"instruction": f"Count to {i}.", "input": "", "output": " ".join(map(str, range(i)))}
                                for i in range(24)]))
    # dropout draws random numbers: the resumed RNG must be the saved one
    settings = {"data": str(data), "rank": 4, "lr": 5e-3, "cutoff": 64, "batch_size": 4, "val_examples": 4,
                "eval_every": 3, "save_every": 3, "dropout": 0.1}
    straight, straight_result = lora_tune(tiny_pruned_llama(tokenizer), tokenizer, TuneConfig(**settings, max_steps=8),
                                          checkpoint_dir=tmp_path / "straight")
    lora_tune(tiny_pruned_llama(tokenizer), tokenizer, TuneConfig(**settings, max_steps=5), checkpoint_dir=tmp_path / "parts")
    with caplog.at_level(logging.INFO, logger="gapprune.tune.checkpoint"):
        resumed, resumed_result = lora_tune(tiny_pruned_llama(tokenizer), tokenizer, TuneConfig(**settings, max_steps=8),
                                            checkpoint_dir=tmp_path / "parts")
    assert "resuming at step 5" in caplog.text  # (a run that ignored the checkpoint would also match below)
    assert resumed_result.steps == straight_result.steps == 8
    assert resumed_result.train_loss == straight_result.train_loss  # the first part's losses come back too
    for (name, a), (_, b) in zip(straight.state_dict().items(), resumed.state_dict().items(), strict=True):
        assert torch.equal(a, b), name
    with pytest.raises(ValueError, match=r"other settings \(rank\)"):
        lora_tune(tiny_pruned_llama(tokenizer), tokenizer, TuneConfig(**{**settings, "rank": 2}, max_steps=9),
                  checkpoint_dir=tmp_path / "parts")
