"""Random-weight deci GGUFs with chosen per-layer shapes: what the microbenchmarks time.

Speed at batch 1 depends on the shapes and the ggml types, not on the values, so a model whose
layers take a grid's head counts and MLP widths, with the real model's hidden size, vocabulary and
tokenizer, times like a pruned model of those shapes. The layers go through `gguf_layout.deci_layers`
exactly as an export does (zero-output padding units and block padding included).
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from gapprune.budgets.table import ModelDims
from gapprune.export import gguf_layout, gguf_tensors


def _random(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    """A stand-in of the right shape: only q8_0 tensors get random values (`_encoded`); float
    matrices stay zero, which ggml multiplies exactly as fast (no value-dependent paths)."""
    return np.broadcast_to(np.float32(0.0), shape)


def _tokenizer_fields(source: Path, cache: dict[str, Any]) -> list[tuple[str, Any, Any, Any]]:
    """The source GGUF's tokenizer keys, read once per cache (gguf-py's reader takes ~25 s for 49k tokens)."""
    key = f"tokenizer/{source}"
    if key not in cache:
        import gguf

        fields = []
        for name, field in gguf.GGUFReader(source).fields.items():
            if name.startswith("tokenizer."):
                vtype = field.types[0]
                fields.append((name, field.contents(), vtype, field.types[1] if vtype == gguf.GGUFValueType.ARRAY else None))
        cache[key] = fields
    return cache[key]


def _encoded(rng: np.random.Generator, array: np.ndarray, type_name: str) -> tuple[np.ndarray, Any]:
    """(data, raw_dtype) of a random tensor of `array`'s shape. q8_0 blocks are drawn directly
    (an f16 scale and 32 random int8 values): gguf-py's quantizer takes half a minute per model."""
    import gguf

    if type_name != "Q8_0":
        return gguf_tensors.encode(array, type_name)
    rows, cols = array.shape
    blocks = rng.integers(-127, 128, size=(rows, cols // 32, 34), dtype=np.int8).view(np.uint8)
    blocks[:, :, :2] = np.frombuffer(np.float16(0.02 / 127).tobytes(), dtype=np.uint8)  # the block scale
    return blocks.reshape(rows, cols // 32 * 34), gguf.GGMLQuantizationType.Q8_0


def _layer_arrays(rng: np.random.Generator, dims: ModelDims, layer: gguf_layout.DeciLayer
                  ) -> list[tuple[str, np.ndarray]]:
    h, d = dims.hidden, dims.head_dim
    out: list[tuple[str, np.ndarray]] = []
    if layer.has_attention:
        out += [("attn_norm.weight", np.ones(h, np.float32)), ("attn_q.weight", _random(rng, (layer.n_heads * d, h))),
                ("attn_k.weight", _random(rng, (layer.n_kv_heads * d, h))),
                ("attn_v.weight", _random(rng, (layer.n_kv_heads * d, h))),
                ("attn_output.weight", _random(rng, (h, layer.n_heads * d)))]
    if layer.has_mlp:
        out += [("ffn_norm.weight", np.ones(h, np.float32)), ("ffn_gate.weight", _random(rng, (layer.n_ff, h))),
                ("ffn_up.weight", _random(rng, (layer.n_ff, h))), ("ffn_down.weight", _random(rng, (h, layer.n_ff)))]
    return out


def write_synthetic_gguf(path: str | Path, dims: ModelDims, shapes: Sequence[tuple[int, int, int]], file_type: str,
                         tokenizer_gguf: str | Path, seed: int = 0, cache: dict[str, Any] | None = None) -> Path:
    """Write a deci GGUF whose layer i has shapes[i] = (n_heads, n_kv_heads, intermediate), random weights.

    `cache` keeps the encoded token embedding between calls (it is the same for every grid point
    and most of the encoding time).
    """
    import gguf

    path = Path(path)
    rng = np.random.default_rng(seed)
    layers = gguf_layout.deci_layers(list(shapes), gguf_tensors.block_size(file_type))
    writer_tmp = tempfile.mkstemp(prefix=f".{path.name}.tmp-", dir=path.parent)
    os.close(writer_tmp[0])
    tmp = Path(writer_tmp[1])
    try:
        writer = gguf.GGUFWriter(tmp, "deci")
        writer.add_name("gapprune-synthetic")
        writer.add_context_length(8192)
        writer.add_embedding_length(dims.hidden)
        writer.add_block_count(len(layers))
        writer.add_feed_forward_length([layer.n_ff for layer in layers])
        writer.add_head_count([layer.n_heads for layer in layers])
        writer.add_head_count_kv([layer.n_kv_heads for layer in layers])
        writer.add_key_length(dims.head_dim)
        writer.add_value_length(dims.head_dim)
        writer.add_rope_dimension_count(dims.head_dim)
        writer.add_rope_freq_base(10000.0)
        writer.add_layer_norm_rms_eps(1e-5)
        writer.add_vocab_size(dims.vocab)
        writer.add_file_type(gguf_tensors.LLAMA_FTYPE[file_type])
        cache = cache if cache is not None else {}
        for name, contents, vtype, sub_type in _tokenizer_fields(Path(tokenizer_gguf), cache):
            writer.add_key_value(name, contents, vtype, sub_type=sub_type)
        key = f"embd/{file_type}/{dims.vocab}x{dims.hidden}"
        if key not in cache:
            array = _random(rng, (dims.vocab, dims.hidden))
            cache[key] = _encoded(rng, array, gguf_tensors.tensor_type("token_embd.weight", file_type,
                                                                      dims.tied, array.shape))
        tensors: list[tuple[str, np.ndarray, bool]] = []
        for i, layer in enumerate(layers):
            tensors += [(f"blk.{i}.{name}", array, False) for name, array in _layer_arrays(rng, dims, layer)]
        tensors.append(("output_norm.weight", np.ones(dims.hidden, np.float32), False))
        if not dims.tied:
            tensors.append(("output.weight", _random(rng, (dims.vocab, dims.hidden)), True))
        data, raw = cache[key]
        writer.add_tensor("token_embd.weight", data, raw_dtype=raw)
        for name, array, is_head in tensors:
            data, raw = _encoded(rng, array, gguf_tensors.tensor_type(name, file_type, is_head, array.shape))
            writer.add_tensor(name, data, raw_dtype=raw)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path
