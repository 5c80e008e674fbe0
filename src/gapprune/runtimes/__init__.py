"""Runtimes a budget is counted and checked in: each one a registered class that measures its per-option cost
table, measures a pruned model, and names what it measures (a GGUF file, a model folder).

To add a runtime: one module here with a `Runtime` subclass decorated `@RUNTIMES.register("name")`, imported
below; `--runtime name` then offers it for `--speedup` / `--max-memory` and `--verify`.
"""

from gapprune.runtimes import llamacpp as _llamacpp  # noqa: F401  (registers llama.cpp)
from gapprune.runtimes import vllm as _vllm  # noqa: F401  (registers vllm)
from gapprune.runtimes.base import RUNTIMES, Runtime

__all__ = ["RUNTIMES", "Runtime"]
