"""vLLM's entry point for gapprune: register the pruned architectures under the names saved folders carry.

vLLM calls `register()` in every process it starts (entry-point group `vllm.general_plugins`). It imports
nothing of gapprune beyond this module and names the model classes as strings, so vLLM imports them only
when it loads a pruned folder.
"""

from __future__ import annotations

MODELS_MODULE = "gapprune.serving.vllm_models"

ARCHITECTURES = (
    "GapprunedLlamaForCausalLM",
    "GapprunedMistralForCausalLM",
    "GapprunedQwen2ForCausalLM",
    "GapprunedQwen3ForCausalLM",
    "GapprunedGemma3ForCausalLM",
)
"""The `architectures` names `export.save` writes for pruned folders (see `modeling_gapprune.py`)."""


def register() -> None:
    """Register every pruned architecture with vLLM's model registry (lazily, by module path)."""
    from vllm import ModelRegistry

    for name in ARCHITECTURES:
        ModelRegistry.register_model(name, f"{MODELS_MODULE}:{name}")
