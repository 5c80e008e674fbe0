"""The key under which a stopped evaluation keeps its answers: a hash of the model's weights.

Answers kept for one model must never be served to another (lm-eval keys its cache by the request
alone), and the same weights must hash alike on any device or thread count, so the hash reads every
tensor's bytes (float sums would differ in their last bits).
"""

from __future__ import annotations

import hashlib
import json

import torch
from transformers import PreTrainedModel


def _add_bytes(digest: hashlib._Hash, tensor: torch.Tensor) -> None:
    digest.update(tensor.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())


def weights_fingerprint(model: torch.nn.Module) -> str:
    """A short hash of every tensor's name, shape, dtype and bytes."""
    digest = hashlib.sha256()
    with torch.no_grad():
        for name, tensor in model.state_dict().items():
            digest.update(json.dumps([name, list(tensor.shape), str(tensor.dtype)]).encode())
            _add_bytes(digest, tensor)
    return digest.hexdigest()[:16]


def tensor_fingerprint(tensor: torch.Tensor) -> str:
    """A short hash of one tensor's shape, dtype and bytes (e.g. the windows a perplexity scores)."""
    digest = hashlib.sha256(json.dumps([list(tensor.shape), str(tensor.dtype)]).encode())
    _add_bytes(digest, tensor)
    return digest.hexdigest()[:16]


def settings_fingerprint(model: PreTrainedModel) -> str:
    """A short hash of what decides a model's outputs beside its weights: its config (not in the state
    dict, e.g. rope settings), attention implementation, device type and torch's version."""
    config = model.config
    settings = json.dumps([config.to_json_string(), str(getattr(config, "_attn_implementation", "")),
                           next(model.parameters()).device.type, torch.__version__], sort_keys=True)
    return hashlib.sha256(settings.encode()).hexdigest()[:8]
