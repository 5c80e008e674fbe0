"""Export: Hugging Face folders with per-layer shapes (`save.py`; `modeling_gapprune.py` subclasses, never copies)
and GGUF files for llama.cpp (`gguf.py`). Nothing is imported here: the GGUF layout that the budgets' memory model
reads (`gguf_tensors`) needs neither torch nor transformers."""
