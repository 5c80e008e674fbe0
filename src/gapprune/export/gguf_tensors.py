"""Tensor types of an exported GGUF: which tensor gets which ggml type, encoded by gguf-py.

The policy follows llama.cpp's own quantizer where it matters for quality and for this export:
1-D tensors (norms, biases) stay float32; a 2-D tensor whose rows (ggml's ne0, the input
dimension) are not a multiple of the type's block size falls back to float16, since ggml cannot
block-quantize it (pruned MLP widths and the one-channel padding unit hit this); and for the 4- and
5-bit types the output head (or the tied token embedding that serves as it) is kept at q8_0.
"""

from __future__ import annotations

import numpy as np

# name -> (weight type, type for the output head / tied embedding)
FILE_TYPES = {
    "f32": ("F32", "F32"),
    "f16": ("F16", "F16"),
    "bf16": ("BF16", "BF16"),
    "q8_0": ("Q8_0", "Q8_0"),
    "q5_1": ("Q5_1", "Q8_0"),
    "q5_0": ("Q5_0", "Q8_0"),
    "q4_1": ("Q4_1", "Q8_0"),
    "q4_0": ("Q4_0", "Q8_0"),
}

# llama.cpp's LLAMA_FTYPE values, written as general.file_type
LLAMA_FTYPE = {"f32": 0, "f16": 1, "q4_0": 2, "q4_1": 3, "q8_0": 7, "q5_0": 8, "q5_1": 9, "bf16": 32}


def block_size(file_type: str) -> int:
    """Values per quantization block of the file's weight type (1 for float types)."""
    import gguf

    return int(gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[FILE_TYPES[file_type][0]]][0])


def tensor_type(name: str, file_type: str, is_head: bool, shape: tuple[int, ...]) -> str:
    """ggml type name for one tensor. `shape` is torch's (out, in): ggml's ne0 is the last entry."""
    import gguf

    if len(shape) < 2:
        return "F32"
    weight, head = FILE_TYPES[file_type]
    wanted = head if is_head else weight
    block, _ = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[wanted]]
    if shape[-1] % block:
        return "F32" if file_type == "f32" else "F16"
    return wanted


def encode(array: np.ndarray, type_name: str) -> tuple[np.ndarray, object]:
    """(data, raw_dtype) for GGUFWriter.add_tensor; array is float32 (out, in) or (n,)."""
    import gguf

    qtype = gguf.GGMLQuantizationType[type_name]
    if qtype == gguf.GGMLQuantizationType.F32:
        return np.ascontiguousarray(array, dtype=np.float32), None
    if qtype == gguf.GGMLQuantizationType.F16:
        return np.ascontiguousarray(array, dtype=np.float16), None
    return gguf.quants.quantize(np.ascontiguousarray(array, dtype=np.float32), qtype), qtype
