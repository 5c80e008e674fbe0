"""The key under which a stopped evaluation keeps its answers: a hash of the model's weights.

Answers kept for one model must never be served to another (lm-eval keys its cache by the request
alone), and the same weights must hash alike on any device or thread count, so the hash reads every
tensor's bytes (float sums would differ in their last bits).
"""

from __future__ import annotations

import hashlib
import json

import torch


def weights_fingerprint(model: torch.nn.Module) -> str:
    """A short hash of every tensor's name, shape, dtype and bytes."""
    digest = hashlib.sha256()
    with torch.no_grad():
        for name, tensor in model.state_dict().items():
            digest.update(json.dumps([name, list(tensor.shape), str(tensor.dtype)]).encode())
            digest.update(tensor.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()[:16]


def tensor_fingerprint(tensor: torch.Tensor) -> str:
    """A short hash of one tensor's shape, dtype and bytes (e.g. the windows a perplexity scores)."""
    digest = hashlib.sha256(json.dumps([list(tensor.shape), str(tensor.dtype)]).encode())
    digest.update(tensor.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()[:16]
