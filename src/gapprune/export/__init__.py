"""Export: Hugging Face folders with per-layer shapes; `modeling_gapprune.py` subclasses, never copies."""

from gapprune.export.save import save

__all__ = ["save"]
