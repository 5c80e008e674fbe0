"""Gemma 3 text decoders (`Gemma3ForCausalLM`, config `Gemma3TextConfig`), 270M to 27B.

Module names match the Llama family (`self_attn.{q,k,v,o}_proj`, `mlp.{gate,up,down}_proj`), so
head and channel surgery is inherited. What differs, and why it matters for pruning:

- each sub-block is wrapped by two RMSNorms, `x + post_norm(block(pre_norm(x)))`; both belong to
  the sub-block (`GEMMA3_NORMS`), so removing it removes both, and the parameter counts include both.
  Masked units still pass through the post-norm, which is why removal equals masking: the post-norm
  sees the same (hidden,) vector either way, and maps the all-zero output of a removed block to zero;
- q_norm / k_norm act per head_dim, shared by all heads: they stay whatever heads go;
- at 270M there is a single KV head, so attention units are the query heads inside that one group
  (options (1, q) for q = n_heads ... 1, and (0, 0));
- the embedding is scaled by sqrt(hidden) inside `embed_tokens`, before the first layer, so cached
  layer inputs already include it; sliding-window and global layers differ only in their mask,
  which the captured layer kwargs carry;
- GeGLU (gelu_tanh gate) keeps the gate/up/down channel structure of SwiGLU.
"""

from __future__ import annotations

from transformers import PreTrainedModel

from gapprune.models.adapter import ADAPTERS
from gapprune.models.llama import LlamaFamilyAdapter
from gapprune.models.modeling_gapprune import GEMMA3_NORMS


@ADAPTERS.register_architecture("Gemma3ForCausalLM")
class Gemma3Adapter(LlamaFamilyAdapter):
    sub_block_norms = GEMMA3_NORMS  # pre- and post-norm: a removed sub-block takes both

    def __init__(self, model: PreTrainedModel) -> None:
        super().__init__(model)
        if getattr(self.config, "final_logit_softcapping", None) is not None:
            # The profilers compute logits as lm_head(norm(h)); a tanh cap on them would be missed.
            raise ValueError(
                "final_logit_softcapping is set on this Gemma model; gapprune's profilers assume plain "
                "linear logits. Set config.final_logit_softcapping = None only if the checkpoint was "
                "trained without it."
            )

    # -- analytic parameter counts (checked against real modules by the contract test) -------
    def attn_option_params(self, layer: int, n_kv_heads: int, heads_per_group: int) -> int:
        if n_kv_heads == 0 or heads_per_group == 0:
            return 0
        hd, hidden = self.head_dim, self.hidden
        n_heads = n_kv_heads * heads_per_group
        total = (2 * n_heads + 2 * n_kv_heads) * hd * hidden  # q, k, v, o
        total += 2 * hidden + 2 * hd  # input/post-attention norms (hidden), q_norm/k_norm (head_dim)
        if getattr(self.config, "attention_bias", False):
            total += (n_heads + 2 * n_kv_heads) * hd + hidden  # q, k, v and o biases
        return total

    def mlp_option_params(self, layer: int, intermediate: int) -> int:
        if intermediate == 0:
            return 0
        return 3 * intermediate * self.hidden + 2 * self.hidden  # gate, up, down + pre/post-feedforward norms
