"""Per-layer shapes of a llama.cpp `deci` GGUF, and the two padding units its graph needs.

llama.cpp's plain `llama` architecture reads per-layer head counts and FFN widths but then builds
every layer with layer 0's values, so a heterogeneous model must be written as `deci` (the
architecture of NVIDIA's Nemotron NAS models), whose graph honours the per-layer values:
`n_head == 0` skips attention, `n_ff == 0` skips the MLP. Two things in that graph need care:

* A layer with `n_ff == 0` ends with `continue` *before* the residual stream is updated, so the
  attention output of such a layer is lost (and on the last layer the row selection of the
  output tokens is lost too). We give such a layer one MLP channel whose gate, up and down
  weights are zero: SiLU(0) * 0 = 0, an exact no-op that costs 3 * hidden + hidden (norm) values.
* llama.cpp derives the head size from layer 0's head count and refuses a model whose layer 0
  has no heads. We give such a layer 0 one attention head (one KV head) with zero q/k/v/o weights:
  its output is o_proj(0) = 0, exact, for 4 * head_dim * hidden + hidden values.

Everything here is plain data so it can be tested without writing a file.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

# transformers families whose decoder is the Llama graph that llama.cpp's deci builds (RMSNorm,
# SwiGLU, rotary, optional biases). Qwen3 (q/k norms) and sliding-window models are not.
SUPPORTED_ARCHITECTURES = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM")


@dataclass(frozen=True)
class DeciLayer:
    """What one decoder layer becomes in the GGUF."""

    n_heads: int  # query heads written (after padding)
    n_kv_heads: int
    n_ff: int  # MLP channels written (after padding)
    zero_head: bool = False  # n_heads == 1 is a zero-output padding head
    zero_ff: bool = False  # n_ff == 1 is a zero-output padding channel
    ff_pad: int = 0  # zero channels appended to the kept ones (n_ff counts them)

    @property
    def has_attention(self) -> bool:
        return self.n_heads > 0

    @property
    def has_mlp(self) -> bool:
        return self.n_ff > 0


def deci_layers(shapes: Sequence[tuple[int, int, int]], ff_multiple: int = 1) -> list[DeciLayer]:
    """Map per-layer `(n_heads, n_kv_heads, intermediate)` to deci layers, padding where needed.

    `ff_multiple` rounds every kept MLP width up with zero channels (exact no-ops) to a multiple of
    a quantization block: ggml quantizes ffn_down along its input (MLP-width) axis, so a pruned
    width such as 1,488 would otherwise leave that tensor in f16, four times a q4_0 one.
    """
    layers = []
    last = len(shapes) - 1
    for i, (n_heads, n_kv, inter) in enumerate(shapes):
        if (n_heads == 0) != (n_kv == 0):
            raise ValueError(f"layer {i}: {n_heads} query heads but {n_kv} KV heads; both must be 0 or > 0")
        if n_heads and n_heads % n_kv:
            raise ValueError(f"layer {i}: {n_heads} query heads do not split evenly over {n_kv} KV heads")
        zero_head = i == 0 and n_heads == 0
        if zero_head:
            n_heads = n_kv = 1
        zero_ff = inter == 0 and (n_heads > 0 or i == last)
        pad = -inter % ff_multiple
        layers.append(DeciLayer(n_heads, n_kv, 1 if zero_ff else inter + pad, zero_head, zero_ff, pad))
    return layers


def padding_params(layers: Sequence[DeciLayer], hidden: int, head_dim: int) -> int:
    """Values the padding units add (weights and their RMSNorm), for reporting the overhead."""
    total = 0
    for layer in layers:
        if layer.zero_head:
            total += 4 * head_dim * hidden + hidden
        if layer.zero_ff:
            total += 3 * hidden + hidden
        total += 3 * hidden * layer.ff_pad
    return total


def rope_interleave(weight: torch.Tensor, n_heads: int) -> torch.Tensor:
    """Reorder q/k rows (or biases) from HF's half-split rotary layout to llama.cpp's interleaved one.

    HF rotates dimension d with d + head_dim/2; llama.cpp's "NORM" rope rotates 2j with 2j + 1. This
    is the row permutation llama.cpp's own converter applies to Llama checkpoints.
    weight: (n_heads * head_dim, ...) -> same shape.
    """
    rows = weight.shape[0]
    head_dim = rows // n_heads
    return weight.reshape(n_heads, 2, head_dim // 2, *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape)


def check_supported(config: Any) -> None:
    """Raise a clear error for a model llama.cpp's deci graph cannot run exactly."""
    arch = ((getattr(config, "architectures", None) or [""])[0]).removeprefix("Gappruned")
    if arch not in SUPPORTED_ARCHITECTURES:
        raise ValueError(
            f"GGUF export supports {', '.join(SUPPORTED_ARCHITECTURES)}; {arch or 'this model'} is not one "
            "(llama.cpp's deci graph has no q/k norms, sliding windows or other block types)"
        )
    window = getattr(config, "sliding_window", None)
    if window is not None and getattr(config, "use_sliding_window", True) and window < config.max_position_embeddings:
        raise ValueError(f"sliding-window attention (window {window}) cannot be exported to a deci GGUF")
    if getattr(config, "hidden_act", "silu") != "silu":
        raise ValueError(f"GGUF export needs a SiLU-gated MLP; this model uses {config.hidden_act!r}")
    if getattr(config, "mlp_bias", False):
        raise ValueError("GGUF export does not support gate/up biases (mlp_bias=True)")
    rope = rope_scaling(config)
    if rope not in (None, "default"):
        raise ValueError(f"rope scaling {rope!r} is not supported by GGUF export yet; only unscaled rotary embeddings")


def rope_scaling(config: Any) -> str | None:
    params = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
    return params.get("rope_type") or params.get("type")


def rope_theta(config: Any) -> float:
    params = getattr(config, "rope_parameters", None) or {}
    theta = params.get("rope_theta") or getattr(config, "rope_theta", None) or 10000.0
    return float(theta)
