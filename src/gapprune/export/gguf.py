"""Write a gapprune model (pruned or dense) as a llama.cpp GGUF of the `deci` architecture.

`deci` is the llama.cpp architecture whose graph honours per-layer head counts and FFN widths
(see `gguf_layout` for why not `llama`, and for the two padding units its graph needs). Q/K rows
are permuted to llama.cpp's interleaved rotary layout, lsq compensation biases go in as
`attn_output.bias` / `ffn_down.bias`, and the tokenizer is copied from the source GGUF or
converted (see `gguf_tokenizer`). Types f32, f16, bf16, q8_0, q5_x and q4_x are encoded by gguf-py;
llama.cpp's k-quants (q4_k_m, ...) go through llama.cpp's own quantizer via cyllama.

The file is written next to the target under a temporary name and renamed at the end, so a failed
export never leaves a partial `.gguf`.
"""

from __future__ import annotations

import logging
import os
import tempfile
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from gapprune.export import gguf_layout, gguf_tensors, gguf_tokenizer
from gapprune.llamacpp_binding import GGUF_EXTRA
from gapprune.output import check_output

log = logging.getLogger(__name__)


# k-quants made by llama.cpp's quantizer (llama_model_quantize through cyllama): name -> LLAMA_FTYPE
LLAMA_QUANTIZER_TYPES = {"q4_k_m": 15, "q4_k_s": 14, "q5_k_m": 17, "q6_k": 18}
# MLP widths are padded to this for k-quants: llama.cpp falls back to 32-value blocks (q5_0, q8_0) for
# rows that are not a multiple of 256, and padding to 256 would cost up to 255 channels a layer.
K_QUANT_FF_MULTIPLE = 32


@dataclass(frozen=True)
class GgufExport:
    path: str
    type: str
    file_bytes: int
    params: int  # values stored in the file (padding units included)
    padding_params: int  # values added by the zero-output padding units
    tokenizer: str  # "gguf:<source>" or "huggingface"

    def to_record(self) -> dict[str, object]:
        return asdict(self)


def supported_types() -> list[str]:
    return [*gguf_tensors.FILE_TYPES, *LLAMA_QUANTIZER_TYPES]


def _import_gguf() -> Any:
    try:
        import gguf
    except ImportError as err:
        raise ImportError(f"GGUF export needs the gguf package; install it with: {GGUF_EXTRA}") from err
    return gguf


def _np(t: torch.Tensor) -> np.ndarray:
    return t.detach().to("cpu", torch.float32).numpy()


def _layer_tensors(layer: Any, deci: gguf_layout.DeciLayer, hidden: int, head_dim: int
                   ) -> Iterator[tuple[str, torch.Tensor]]:
    """(gguf suffix, tensor) of one decoder layer in torch's (out, in) layout."""
    if deci.zero_head:
        zeros = torch.zeros(head_dim, hidden)  # (head_dim, hidden)
        yield "attn_norm.weight", torch.ones(hidden)
        yield from (("attn_q.weight", zeros), ("attn_k.weight", zeros), ("attn_v.weight", zeros))
        yield "attn_output.weight", torch.zeros(hidden, head_dim)
    elif deci.has_attention:
        attn = layer.self_attn
        q, k = attn.q_proj, attn.k_proj
        assert q.weight.shape == (deci.n_heads * head_dim, hidden), q.weight.shape
        assert k.weight.shape == (deci.n_kv_heads * head_dim, hidden), k.weight.shape
        yield "attn_norm.weight", layer.input_layernorm.weight
        yield "attn_q.weight", gguf_layout.rope_interleave(q.weight, deci.n_heads)
        yield "attn_k.weight", gguf_layout.rope_interleave(k.weight, deci.n_kv_heads)
        yield "attn_v.weight", attn.v_proj.weight
        yield "attn_output.weight", attn.o_proj.weight
        if q.bias is not None:
            yield "attn_q.bias", gguf_layout.rope_interleave(q.bias, deci.n_heads)
        if k.bias is not None:
            yield "attn_k.bias", gguf_layout.rope_interleave(k.bias, deci.n_kv_heads)
        if attn.v_proj.bias is not None:
            yield "attn_v.bias", attn.v_proj.bias
        if attn.o_proj.bias is not None:
            yield "attn_output.bias", attn.o_proj.bias
    if deci.zero_ff:
        yield "ffn_norm.weight", torch.ones(hidden)
        yield "ffn_gate.weight", torch.zeros(1, hidden)
        yield "ffn_up.weight", torch.zeros(1, hidden)
        yield "ffn_down.weight", torch.zeros(hidden, 1)
    elif deci.has_mlp:
        mlp, pad = layer.mlp, deci.ff_pad
        assert mlp.down_proj.weight.shape == (hidden, deci.n_ff - pad), mlp.down_proj.weight.shape
        rows = torch.zeros(pad, hidden)  # (pad, hidden): zero channels, SiLU(0) * 0 = 0
        yield "ffn_norm.weight", layer.post_attention_layernorm.weight
        yield "ffn_gate.weight", torch.cat([mlp.gate_proj.weight, rows])
        yield "ffn_up.weight", torch.cat([mlp.up_proj.weight, rows])
        yield "ffn_down.weight", torch.cat([mlp.down_proj.weight, rows.T], dim=1)  # (hidden, n_ff)
        if mlp.down_proj.bias is not None:
            yield "ffn_down.bias", mlp.down_proj.bias


def _model_tensors(model: Any, layers: list[gguf_layout.DeciLayer], hidden: int, head_dim: int
                   ) -> Iterator[tuple[str, torch.Tensor, bool]]:
    """(gguf name, tensor, is_output_head) for the whole model."""
    tied = bool(getattr(model.config, "tie_word_embeddings", False))
    yield "token_embd.weight", model.model.embed_tokens.weight, tied
    for i, (layer, deci) in enumerate(zip(model.model.layers, layers)):
        for suffix, tensor in _layer_tensors(layer, deci, hidden, head_dim):
            yield f"blk.{i}.{suffix}", tensor, False
    yield "output_norm.weight", model.model.norm.weight, False
    if not tied:
        yield "output.weight", model.lm_head.weight, True


def record_gguf_source(model: Any, spec: str) -> None:
    """Remember in the config (and so in a saved folder's config.json) that `model` came from the
    GGUF file or alias `spec`, so a later export can copy that file's tokenizer exactly."""
    from gapprune.models.loading import ALIASES

    if spec in ALIASES:
        model.config.gguf_source = spec
    elif spec.endswith(".gguf"):
        model.config.gguf_source = str(Path(spec).resolve())


def gguf_source(config: Any, explicit: str | Path | None = None) -> Path | None:
    """The GGUF file to copy the tokenizer from: `explicit`, else the one recorded in the config
    by `record_gguf_source` when it is still on this machine, else None."""
    from gapprune.models.loading import ALIASES, resolve_alias

    if explicit is not None:
        if not Path(explicit).is_file():
            raise FileNotFoundError(f"tokenizer GGUF {explicit} does not exist")
        return Path(explicit)
    spec = getattr(config, "gguf_source", None)
    if not spec:
        return None
    try:
        path = resolve_alias(spec) if spec in ALIASES else Path(spec)
    except FileNotFoundError:
        return None
    return path if path.is_file() else None


def _write(model: Any, tokenizer: Any, path: Path, file_type: str, tokenizer_gguf: str | Path | None,
           ff_multiple: int) -> tuple[int, int, str]:
    """Write the GGUF at `path`; returns (params, padding params, tokenizer source)."""
    gguf = _import_gguf()
    config = model.config
    from gapprune.models import get_adapter

    adapter = get_adapter(model)
    hidden, head_dim = adapter.hidden, adapter.head_dim
    shapes = [(s.n_heads, s.n_kv_heads, s.intermediate) for s in adapter.shapes()]
    layers = gguf_layout.deci_layers(shapes, ff_multiple)
    writer = gguf.GGUFWriter(path, "deci")
    writer.add_name(str(getattr(config, "_name_or_path", "") or "gapprune model").rstrip("/").split("/")[-1])
    writer.add_context_length(int(config.max_position_embeddings))
    writer.add_embedding_length(hidden)
    writer.add_block_count(len(layers))
    writer.add_feed_forward_length([layer.n_ff for layer in layers])
    writer.add_head_count([layer.n_heads for layer in layers])
    writer.add_head_count_kv([layer.n_kv_heads for layer in layers])
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    writer.add_rope_dimension_count(head_dim)
    writer.add_rope_freq_base(gguf_layout.rope_theta(config))
    writer.add_layer_norm_rms_eps(float(config.rms_norm_eps))
    writer.add_vocab_size(int(config.vocab_size))
    writer.add_file_type(gguf_tensors.LLAMA_FTYPE[file_type])
    source = gguf_source(config, tokenizer_gguf)
    if source is not None:
        gguf_tokenizer.copy_tokenizer(source, writer)
        tokenizer_from = f"gguf:{source.name}"
    elif tokenizer is not None:
        gguf_tokenizer.convert_tokenizer(tokenizer, writer, int(config.vocab_size))
        tokenizer_from = "huggingface"
    else:
        raise ValueError("the model has no tokenizer and no source GGUF; save the folder with its tokenizer first")
    params = 0
    for name, tensor, is_head in _model_tensors(model, layers, hidden, head_dim):
        array = _np(tensor)
        type_name = gguf_tensors.tensor_type(name, file_type, is_head, array.shape)
        data, raw_dtype = gguf_tensors.encode(array, type_name)
        writer.add_tensor(name, data, raw_dtype=raw_dtype)
        params += array.size
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return params, gguf_layout.padding_params(layers, hidden, head_dim), tokenizer_from


def _llama_quantize(src: Path, dst: Path, file_type: str) -> None:
    """Quantize `src` into `dst` with llama.cpp's own quantizer (k-quants), through cyllama."""
    from gapprune.llamacpp_binding import import_cyllama

    cy = import_cyllama()
    params = cy.LlamaModelQuantizeParams()
    params.ftype = LLAMA_QUANTIZER_TYPES[file_type]
    params.nthread = os.cpu_count() or 1
    cy.model_quantize(str(src), str(dst), params)


def check_export_args(out: str | Path, file_type: str, overwrite: bool) -> None:
    """Fail before any work on a bad file name, type or an existing file."""
    out = Path(out)
    if file_type not in LLAMA_QUANTIZER_TYPES and file_type not in gguf_tensors.FILE_TYPES:
        raise ValueError(f"unknown GGUF type {file_type!r}; choose one of {', '.join(supported_types())}")
    if out.suffix != ".gguf":
        raise ValueError(f"{out} does not end in .gguf; name the output file FILE.gguf")
    check_output(out, overwrite=overwrite, kind="file", flag="--gguf")


@torch.inference_mode()
def export_gguf(
    model: Any, tokenizer: Any, out: str | Path, *, file_type: str = "f16", overwrite: bool = False,
    tokenizer_gguf: str | Path | None = None,
) -> GgufExport:
    """Write `model` (and its tokenizer) to the GGUF file `out`, atomically.

    The tokenizer comes from `tokenizer_gguf` if given, else from the GGUF recorded by
    `record_gguf_source`, else it is converted from the Hugging Face `tokenizer`.
    """
    out = Path(out)
    check_export_args(out, file_type, overwrite)
    gguf_layout.check_supported(model.config)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp_paths = []
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{out.name}.tmp-", dir=out.parent)
        os.close(fd)
        tmp_paths.append(Path(tmp))
        if file_type in LLAMA_QUANTIZER_TYPES:
            params, padding, tok = _write(model, tokenizer, Path(tmp), "f32", tokenizer_gguf, K_QUANT_FF_MULTIPLE)
            fd, final = tempfile.mkstemp(prefix=f".{out.name}.tmp-", dir=out.parent)
            os.close(fd)
            tmp_paths.append(Path(final))
            _llama_quantize(Path(tmp), Path(final), file_type)
        else:
            params, padding, tok = _write(model, tokenizer, Path(tmp), file_type, tokenizer_gguf,
                                         gguf_tensors.block_size(file_type))
            final = tmp
        os.replace(final, out)
    finally:
        for path in tmp_paths:
            path.unlink(missing_ok=True)
    if padding:
        log.info("GGUF padding units add %d values (%.3f%% of the file's parameters)", padding, 100 * padding / params)
    return GgufExport(str(out), file_type, out.stat().st_size, params, padding, tok)
