"""Bytes of a deci GGUF's tensors at a ggml type, and of llama.cpp's KV cache: the memory cost model.

Counted the way llama.cpp lays the file out (`export/gguf_layout`, `export/gguf_tensors`): norms in
f32, a matrix whose rows are not a multiple of the block size in f16, MLP widths padded with zero
channels to the block size. The KV cache holds K and V for every layer's KV heads at every cell of
the context (f16 by default); layers without KV heads hold none.
"""

from __future__ import annotations

import math

from gapprune.budgets.dims import ModelDims
from gapprune.export import gguf_tensors

KV_CACHE_BYTES = 2  # llama.cpp's default cache type (f16) per value
KV_CELL_MULTIPLE = 256  # llama.cpp rounds the context (KV cells) up to this


def tensor_bytes(file_type: str, shape: tuple[int, ...], is_head: bool = False) -> int:
    """Bytes of one tensor of torch shape (out, in) in a GGUF of `file_type`."""
    import gguf

    type_name = gguf_tensors.tensor_type("", file_type, is_head, shape)
    block, size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[type_name]]
    values = math.prod(shape)
    return values // block * size


def padded_width(width: int, file_type: str) -> int:
    """MLP channels written for `width` kept ones (zero channels up to a block multiple)."""
    return width + (-width % gguf_tensors.block_size(file_type)) if width else 0


def attn_bytes(dims: ModelDims, n_heads: int, n_kv_heads: int, file_type: str) -> int:
    """attn_norm + q, k, v, o of one layer; 0 without heads."""
    if n_heads == 0:
        return 0
    h, d = dims.hidden, dims.head_dim
    return (tensor_bytes(file_type, (h,)) + tensor_bytes(file_type, (n_heads * d, h))
            + 2 * tensor_bytes(file_type, (n_kv_heads * d, h)) + tensor_bytes(file_type, (h, n_heads * d)))


def mlp_bytes(dims: ModelDims, width: int, file_type: str) -> int:
    """ffn_norm + gate, up, down of one layer at its padded width.

    An emptied MLP still costs its one zero padding channel and norm (`gguf_layout.deci_layers`):
    the export writes them wherever the layer keeps attention or is the last one. Charging them to
    every emptied MLP keeps the cost additive per component and errs on the safe side of a memory cap.
    """
    w = padded_width(width, file_type) or 1
    h = dims.hidden
    return tensor_bytes(file_type, (h,)) + 2 * tensor_bytes(file_type, (w, h)) + tensor_bytes(file_type, (h, w))


def fixed_bytes(dims: ModelDims, file_type: str) -> int:
    """Token embedding, final norm and (untied) output head: what pruning never shrinks."""
    total = tensor_bytes(file_type, (dims.vocab, dims.hidden), is_head=dims.tied)
    total += tensor_bytes(file_type, (dims.hidden,))
    if not dims.tied:
        total += tensor_bytes(file_type, (dims.vocab, dims.hidden), is_head=True)
    return total


def kv_bytes_per_cell(dims: ModelDims, n_kv_heads: int) -> int:
    """K and V bytes one layer holds per context cell."""
    return 2 * n_kv_heads * dims.head_dim * KV_CACHE_BYTES


def kv_cells(context: int) -> int:
    """KV cells llama.cpp allocates for a context of `context` tokens."""
    return -(-context // KV_CELL_MULTIPLE) * KV_CELL_MULTIPLE
