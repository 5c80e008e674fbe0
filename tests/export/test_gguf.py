"""GGUF export: llama.cpp (through cyllama) gives transformers' logits and token ids.

Tolerance: with an f32 export, llama.cpp's float32 KV cache and flash attention off, llama.cpp's
logits equal transformers' to within 1e-5 absolute (the tiny models' logits are of order 0.5; the
measured gap is ~2e-7, float32 summation order). Quantized exports are checked loosely.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

import gapprune
from gapprune.cli import main
from gapprune.export.gguf import export_gguf, record_gguf_source
from gapprune.export.gguf_layout import DeciLayer, deci_layers, padding_params
from gapprune.export.save import save
from gapprune.models import get_adapter

pytest.importorskip("gguf")
pytest.importorskip("cyllama")
from gapprune.evaluate.llamacpp import GgufRunner

ATOL_F32 = 1e-5
TEXTS = [
    "the cat sat on the mat.",
    "The dog ate 1234 bones!  Twice,\n\tthen slept…",
    "<s>special</s> tokens inside text, and 'quotes' don't split oddly",
]


def byte_level_tokenizer() -> PreTrainedTokenizerFast:
    """A small byte-level BPE tokenizer (GPT-2 regex), trained deterministically on fixed text."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<s>", "</s>"], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(TEXTS * 20, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>")


@pytest.fixture(scope="module")
def tokenizer() -> PreTrainedTokenizerFast:
    return byte_level_tokenizer()


def tiny(family: str, vocab_size: int, seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    kwargs = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 5, "num_attention_heads": 4,
              "num_key_value_heads": 2, "vocab_size": vocab_size, "max_position_embeddings": 256}
    if family == "qwen2":  # q/k/v biases
        config, cls = Qwen2Config(**kwargs), Qwen2ForCausalLM
    else:
        config, cls = LlamaConfig(**kwargs, tie_word_embeddings=False), LlamaForCausalLM
    config.architectures = [cls.__name__]
    return cls(config).eval()


def _with_bias(linear: nn.Linear) -> nn.Linear:
    """The same Linear plus a bias, as lsq compensation leaves it."""
    new = nn.Linear(linear.in_features, linear.out_features, bias=True)
    new.weight.data.copy_(linear.weight.data)
    new.bias.data.normal_(0.0, 0.2)
    return new


def heterogeneous(model: nn.Module) -> nn.Module:
    """Every shape the export must handle, 4 query heads over 2 KV groups in the dense model."""
    adapter = get_adapter(model)
    adapter.prune_attention_(0, [])  # layer 0: all heads removed
    adapter.prune_mlp_(0, [*range(0, 128, 4), 1, 3, 5])  # 35 channels: not a multiple of a quant block
    adapter.prune_attention_(1, [0, 2])  # 2 KV groups x 1 query head
    adapter.prune_mlp_(1, [])  # attention but no MLP
    adapter.prune_attention_(2, [])
    adapter.prune_mlp_(2, [])  # an empty layer
    adapter.prune_attention_(3, [2, 3])  # 1 KV group x 2 query heads
    adapter.prune_mlp_(3, list(range(64)))
    adapter.prune_mlp_(4, [])  # last layer: full attention, no MLP
    layers = adapter.layers
    layers[0].mlp.down_proj = _with_bias(layers[0].mlp.down_proj)
    layers[1].self_attn.o_proj = _with_bias(layers[1].self_attn.o_proj)
    layers[3].self_attn.o_proj = _with_bias(layers[3].self_attn.o_proj)
    layers[3].mlp.down_proj = _with_bias(layers[3].mlp.down_proj)
    adapter.record_shapes_()
    return model


@pytest.fixture(params=["llama", "qwen2"])
def pruned(request: pytest.FixtureRequest, tokenizer: PreTrainedTokenizerFast) -> nn.Module:
    return heterogeneous(tiny(request.param, len(tokenizer)))


def hf_logits(model: nn.Module, ids: list[int]) -> np.ndarray:
    with torch.inference_mode():
        return model(input_ids=torch.tensor([ids])).logits[0].numpy()  # (T, V)


def test_layout_pads_only_where_the_deci_graph_needs_it():
    layers = deci_layers([(0, 0, 35), (2, 2, 0), (0, 0, 0), (2, 1, 64), (4, 2, 0)])
    assert layers == [
        DeciLayer(1, 1, 35, zero_head=True),  # llama.cpp reads the head size from layer 0
        DeciLayer(2, 2, 1, zero_ff=True),  # n_ff == 0 would drop this layer's attention output
        DeciLayer(0, 0, 0),  # an empty layer needs nothing
        DeciLayer(2, 1, 64),
        DeciLayer(4, 2, 1, zero_ff=True),
    ]
    hidden, head_dim = 64, 16
    assert padding_params(layers, hidden, head_dim) == (4 * head_dim * hidden + hidden) + 2 * (4 * hidden)
    assert deci_layers([(4, 2, 128)] * 3) == [DeciLayer(4, 2, 128)] * 3  # dense: no padding at all
    padded = deci_layers([(4, 2, 35), (4, 2, 64), (4, 2, 0)], ff_multiple=32)  # for a 32-value quant block
    assert [(layer.n_ff, layer.ff_pad) for layer in padded] == [(64, 29), (64, 0), (1, 0)]
    assert padding_params(padded, hidden, head_dim) == 29 * 3 * hidden + 4 * hidden
    with pytest.raises(ValueError, match="do not split evenly"):
        deci_layers([(3, 2, 8)])


def test_llamacpp_logits_equal_transformers_for_a_prompt_and_kv_cache_decoding(pruned, tokenizer, tmp_path):
    shapes = [(s.n_heads, s.n_kv_heads, s.intermediate) for s in get_adapter(pruned).shapes()]
    assert shapes == [(0, 0, 35), (2, 2, 0), (0, 0, 0), (2, 1, 64), (4, 2, 0)]
    result = export_gguf(pruned, tokenizer, tmp_path / "m.gguf", file_type="f32")
    assert result.padding_params == (4 * 16 * 64 + 64) + 2 * (4 * 64)
    prompt = tokenizer(TEXTS[1], add_special_tokens=False)["input_ids"]
    runner = GgufRunner(result.path, n_ctx=128, n_batch=64)
    try:
        np.testing.assert_allclose(runner.decode(prompt), hf_logits(pruned, prompt), rtol=0, atol=ATOL_F32)
        # KV-cache decoding: transformers' cached greedy generation vs llama.cpp's, token by token
        with torch.inference_mode():
            gen = pruned.generate(torch.tensor([prompt[:6]]), max_new_tokens=10, do_sample=False, pad_token_id=0,
                                  output_logits=True, return_dict_in_generate=True)
        runner.clear()
        runner.decode(prompt[:6], all_logits=False)
        seq = list(prompt[:6])
        for step, expected in enumerate(gen.logits):
            got = runner.last_logits()
            np.testing.assert_allclose(got, expected[0].numpy(), rtol=0, atol=ATOL_F32)
            seq.append(int(got.argmax()))
            runner.decode([seq[-1]], start=len(seq) - 1, all_logits=False)
        assert seq == gen.sequences[0].tolist()
    finally:
        runner.close()


@pytest.mark.parametrize("file_type,tol", [("f16", 2e-3), ("q8_0", 3e-2), ("q4_0", 0.05), ("q4_k_m", 0.05)])
def test_quantized_exports_load_and_stay_close(file_type, tol, tokenizer, tmp_path):
    model = heterogeneous(tiny("llama", len(tokenizer)))
    f32 = export_gguf(model, tokenizer, tmp_path / "f32.gguf", file_type="f32")
    result = export_gguf(model, tokenizer, tmp_path / f"{file_type}.gguf", file_type=file_type)
    assert result.file_bytes < f32.file_bytes
    ids = tokenizer(TEXTS[0], add_special_tokens=False)["input_ids"]
    runner = GgufRunner(result.path, n_ctx=64, n_batch=64)
    try:
        expected = hf_logits(model, ids)
        assert np.abs(runner.decode(ids) - expected).max() <= tol * np.abs(expected).max()
    finally:
        runner.close()


def test_llamacpp_token_ids_equal_transformers_token_ids(tokenizer, tmp_path):
    model = tiny("llama", len(tokenizer))
    result = export_gguf(model, tokenizer, tmp_path / "m.gguf", file_type="f32")
    assert result.tokenizer == "huggingface"
    runner = GgufRunner(result.path, n_ctx=64, n_batch=64)
    try:
        for text in TEXTS:
            assert runner.tokenize(text) == tokenizer(text, add_special_tokens=False)["input_ids"], text
    finally:
        runner.close()


def test_gguf_source_survives_save_and_reload_and_feeds_the_tokenizer(tokenizer, tmp_path):
    model = tiny("llama", len(tokenizer))
    first = export_gguf(model, tokenizer, tmp_path / "first.gguf", file_type="f32")
    record_gguf_source(model, first.path)
    folder = save(heterogeneous(model), tokenizer, tmp_path / "pruned")
    reloaded, _ = gapprune.load(str(folder))
    assert reloaded.config.gguf_source == str((tmp_path / "first.gguf").resolve())
    second = export_gguf(reloaded, None, tmp_path / "second.gguf", file_type="f32")
    assert second.tokenizer == "gguf:first.gguf"
    runner = GgufRunner(second.path, n_ctx=64, n_batch=64)
    try:
        assert runner.tokenize(TEXTS[2]) == tokenizer(TEXTS[2], add_special_tokens=False)["input_ids"]
    finally:
        runner.close()


def test_cli_export_of_a_pruned_folder(tokenizer, tmp_path, capsys):
    model = heterogeneous(tiny("llama", len(tokenizer)))
    folder = save(model, tokenizer, tmp_path / "pruned")
    out = tmp_path / "pruned.gguf"
    assert main(["export", str(folder), "--gguf", str(out), "--type", "f32"]) == 0
    assert "padding" in capsys.readouterr().out
    ids = tokenizer(TEXTS[0], add_special_tokens=False)["input_ids"]
    runner = GgufRunner(out, n_ctx=64, n_batch=64)
    try:
        np.testing.assert_allclose(runner.decode(ids), hf_logits(model, ids), rtol=0, atol=ATOL_F32)
    finally:
        runner.close()
    assert main(["export", str(folder), "--gguf", str(out)]) == 2  # exists, no --overwrite
    assert main(["export", str(folder), "--gguf", str(tmp_path / "x.gguf"), "--type", "q3_x"]) == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pruned", "pruned.gguf"]


def test_unsupported_models_and_arguments_are_clear_errors(tokenizer, tmp_path):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    config = Qwen3Config(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, head_dim=16, vocab_size=len(tokenizer))
    config.architectures = ["Qwen3ForCausalLM"]
    with pytest.raises(ValueError, match="Qwen3ForCausalLM is not one"):
        export_gguf(Qwen3ForCausalLM(config), tokenizer, tmp_path / "q3.gguf")
    model = tiny("llama", len(tokenizer))
    with pytest.raises(ValueError, match="unknown GGUF type"):
        export_gguf(model, tokenizer, tmp_path / "m.gguf", file_type="q3_x")
    with pytest.raises(ValueError, match="does not end in .gguf"):
        export_gguf(model, tokenizer, tmp_path / "m.bin")
    model.config.rope_parameters = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0}
    with pytest.raises(ValueError, match="rope scaling 'yarn'"):
        export_gguf(model, tokenizer, tmp_path / "m.gguf")
    assert list(tmp_path.iterdir()) == []


def test_failed_export_leaves_no_file(tokenizer, tmp_path, monkeypatch):
    from gapprune.export import gguf_tensors

    def boom(array, type_name):
        raise RuntimeError("disk full")

    monkeypatch.setattr(gguf_tensors, "encode", boom)
    with pytest.raises(RuntimeError, match="disk full"):
        export_gguf(tiny("llama", len(tokenizer)), tokenizer, tmp_path / "m.gguf")
    assert list(tmp_path.iterdir()) == []


@pytest.fixture(scope="module")
def smollm2_pruned():
    try:
        model, tokenizer = gapprune.load("smollm2-135m")
    except FileNotFoundError as err:
        pytest.skip(str(err))
    record_gguf_source(model, "smollm2-135m")
    adapter = get_adapter(model)
    adapter.prune_attention_(0, [])  # 9 query heads over 3 KV groups in the dense model
    adapter.prune_attention_(3, [0, 1, 3, 4])  # 2 groups x 2 heads
    adapter.prune_mlp_(4, [])
    adapter.prune_mlp_(7, list(range(0, 1536, 3)))
    adapter.layers[7].mlp.down_proj = _with_bias(adapter.layers[7].mlp.down_proj)
    adapter.record_shapes_()
    return model, tokenizer


SMOLLM2_TEXT = (
    " = Valkyria Chronicles III = \n Senjō no Valkyria 3 : Unrecorded Chronicles ( Japanese : 戦場のヴァルキュリア3 ) "
    "is a tactical role @-@ playing video game developed by Sega and Media.Vision for the PlayStation Portable . "
    "Released in January 2011 in Japan , it is the third game in the Valkyria series ; 1,234.5 % of   spaces\n\n"
)


@pytest.mark.slow
def test_smollm2_gguf_matches_transformers_with_copied_and_converted_tokenizers(smollm2_pruned, tmp_path):
    model, tokenizer = smollm2_pruned
    chat = tokenizer.apply_chat_template([{"role": "user", "content": "What is 12 + 30?"}], tokenize=False,
                                         add_generation_prompt=True)
    copied = export_gguf(model, tokenizer, tmp_path / "copied.gguf", file_type="f32")
    assert copied.tokenizer == "gguf:SmolLM2-135M-Instruct.Q4_1.gguf"
    assert copied.padding_params == 4 * 64 * 576 + 576 + 4 * 576  # layer 0's head, layer 4's MLP channel
    ids = tokenizer(SMOLLM2_TEXT, add_special_tokens=False)["input_ids"]
    runner = GgufRunner(copied.path, n_ctx=256, n_batch=256)
    try:
        for text in (SMOLLM2_TEXT, chat):
            assert runner.tokenize(text) == tokenizer(text, add_special_tokens=False)["input_ids"]
        expected = hf_logits(model, ids)
        np.testing.assert_allclose(runner.decode(ids), expected, rtol=0, atol=1e-3)  # logits up to ~30
    finally:
        runner.close()
    del model.config.gguf_source  # now the tokenizer is converted from transformers' tokenizer.json
    try:
        converted = export_gguf(model, tokenizer, tmp_path / "converted.gguf", file_type="f16")
    finally:
        record_gguf_source(model, "smollm2-135m")
    assert converted.tokenizer == "huggingface"
    runner = GgufRunner(converted.path, n_ctx=256, n_batch=256)
    try:
        for text in (SMOLLM2_TEXT, chat):
            assert runner.tokenize(text) == tokenizer(text, add_special_tokens=False)["input_ids"]
    finally:
        runner.close()


def test_gguf_perplexity_equals_transformers_perplexity_and_speed_runs(tokenizer, tmp_path):
    from gapprune.evaluate.llamacpp import gguf_perplexity, gguf_speed
    from gapprune.evaluate.perplexity import perplexity

    model = heterogeneous(tiny("llama", len(tokenizer)))
    path = export_gguf(model, tokenizer, tmp_path / "m.gguf", file_type="f32").path
    windows = torch.randint(0, len(tokenizer), (3, 32), generator=torch.Generator().manual_seed(0))
    expected = perplexity(model, windows, batch_size=2, progress=False)
    got = gguf_perplexity(path, windows)
    assert (got.windows, got.predicted_tokens) == (expected.windows, expected.predicted_tokens)
    assert got.ppl == pytest.approx(expected.ppl, rel=1e-5)
    speed = gguf_speed(path, prompt_tokens=16, new_tokens=4, repeats=2)
    assert len(speed.decode_tokens_per_s_all) == 2 and speed.prefill_tokens_per_s > 0
