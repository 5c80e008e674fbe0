"""The llama.cpp binding (cyllama), imported on first use with an error that names the extra to install.

Exporting checks a GGUF loads, budgets measure memory and evaluation runs GGUF files: all three reach
llama.cpp through this one import, kept at the bottom of the house so none of them imports another for it.
"""

from __future__ import annotations

from typing import Any

GGUF_EXTRA = "pip install 'gapprune[gguf]'"


def import_cyllama() -> Any:
    """The cyllama llama.cpp bindings, or an ImportError that names the extra to install."""
    try:
        import cyllama.llama.llama_cpp as cy
    except ImportError as err:
        raise ImportError(f"running GGUF files needs cyllama; install it with: {GGUF_EXTRA}") from err
    return cy
