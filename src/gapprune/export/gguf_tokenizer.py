"""Tokenizer metadata for an exported GGUF, so llama.cpp produces the same token ids as transformers.

Two sources, best first:
* the GGUF the model was loaded from (`config.gguf_source`, recorded by `gapprune.load`): its
  `tokenizer.*` keys are copied verbatim, which is exactly the vocabulary transformers was built from;
* the Hugging Face tokenizer otherwise: byte-level BPE tokenizers (GPT-2, Llama 3, Qwen2, SmolLM
  style) are converted to llama.cpp's `gpt2` tokenizer model. The pre-tokenizer name llama.cpp
  needs is read off the tokenizer.json structure for the regex families we can recognise exactly;
  anything else is a clear error rather than a GGUF that tokenizes differently.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

# llama.cpp token types (llama_token_type)
NORMAL, CONTROL, USER_DEFINED = 1, 3, 4


def copy_tokenizer(source: Path, writer: Any) -> None:
    """Copy every `tokenizer.*` key (and the licence) from the GGUF at `source` into `writer`."""
    import gguf

    reader = gguf.GGUFReader(source)
    copied = 0
    for name, field in reader.fields.items():
        if not (name.startswith("tokenizer.") or name == "general.license"):
            continue
        vtype = field.types[0]
        sub_type = field.types[1] if vtype == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(name, field.contents(), vtype, sub_type=sub_type)
        copied += 1
    if not copied:
        raise ValueError(f"{source} holds no tokenizer metadata; export from the Hugging Face tokenizer instead")


def _pre_tokenizer_name(spec: dict[str, Any]) -> str:
    """llama.cpp's `tokenizer.ggml.pre` for a byte-level BPE tokenizer.json, or a clear error."""
    pre = spec.get("pre_tokenizer") or {}
    parts = pre.get("pretokenizers", [pre]) if pre.get("type") == "Sequence" else [pre]
    kinds = [p.get("type") for p in parts]
    byte_level = [p for p in parts if p.get("type") == "ByteLevel"]
    if not byte_level or not byte_level[-1].get("use_regex", True):
        raise ValueError(f"unsupported pre-tokenizer {kinds}: only byte-level BPE with the GPT-2 regex is converted")
    if kinds == ["ByteLevel"]:
        return "gpt-2"
    if kinds == ["Digits", "ByteLevel"] and parts[0].get("individual_digits"):
        return "smollm"  # digits split one by one, then the GPT-2 regex
    raise ValueError(
        f"pre-tokenizer {kinds} has no exact llama.cpp equivalent known to gapprune; "
        "load the model from its GGUF so the tokenizer can be copied"
    )


def convert_tokenizer(tokenizer: Any, writer: Any, vocab_size: int) -> None:
    """Write a byte-level BPE Hugging Face fast tokenizer as llama.cpp `gpt2` tokenizer metadata."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        raise ValueError("GGUF export needs a fast (tokenizer.json) tokenizer to convert; none was found")
    spec = json.loads(backend.to_str())
    model = spec["model"]
    if model.get("type") != "BPE":
        raise ValueError(f"tokenizer model {model.get('type')!r} is not converted; only byte-level BPE is")
    pre = _pre_tokenizer_name(spec)
    vocab: dict[str, int] = dict(model["vocab"])
    added = {t["content"]: t for t in spec.get("added_tokens", [])}
    for content, token in added.items():
        vocab[content] = token["id"]
    if max(vocab.values()) >= vocab_size:
        raise ValueError(f"tokenizer has ids up to {max(vocab.values())} but the model's vocabulary is {vocab_size}")
    tokens = [f"[PAD{i}]" for i in range(vocab_size)]
    types = [USER_DEFINED] * vocab_size  # unused padding rows never come out of the tokenizer
    for content, idx in vocab.items():
        tokens[idx] = content
        types[idx] = (CONTROL if added[content].get("special") else USER_DEFINED) if content in added else NORMAL
    merges = [m if isinstance(m, str) else " ".join(m) for m in model.get("merges", [])]
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(pre)
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(merges)
    for role in ("bos", "eos", "pad", "unk"):
        token_id = getattr(tokenizer, f"{role}_token_id", None)
        if token_id is not None:
            getattr(writer, f"add_{role}_token_id")(int(token_id))
    writer.add_add_bos_token(bool(getattr(tokenizer, "add_bos_token", False)))
    template = getattr(tokenizer, "chat_template", None)
    if isinstance(template, str):
        writer.add_chat_template(template)
