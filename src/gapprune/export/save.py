"""Write a pruned model as a Hugging Face folder that loads anywhere.

`config.json` keeps the family's config plus `layer_shapes` and an `auto_map` pointing at
`modeling_gapprune.py` (copied beside the weights), so stock transformers loads it with
`trust_remote_code=True` and gapprune loads it without. Everything is written into a temporary
folder next to the target and renamed at the end: a crash never leaves a half-written model.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from transformers import PreTrainedModel, PreTrainedTokenizerBase

from gapprune.models import modeling_gapprune
from gapprune.models.streaming import is_streamed, save_streamed

MODELING_FILE = "modeling_gapprune.py"


def pruned_class_name(architecture: str) -> str:
    base = architecture.removeprefix("Gappruned")
    if base not in modeling_gapprune.PRUNED_CLASS_FOR_ARCHITECTURE:
        supported = ", ".join(modeling_gapprune.PRUNED_CLASS_FOR_ARCHITECTURE)
        raise ValueError(f"cannot export architecture {architecture!r}; supported: {supported}")
    return modeling_gapprune.PRUNED_CLASS_FOR_ARCHITECTURE[base].__name__


def write_atomically(out: str | Path, fill: Callable[[Path], None], *, overwrite: bool = False) -> Path:
    """Create folder `out` by `fill(tmp)` on a temporary sibling folder renamed at the end."""
    out = Path(out)
    if out.exists() and not overwrite:
        raise FileExistsError(f"{out} already exists; choose another output folder or pass overwrite")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        fill(tmp)
        if out.exists():
            shutil.rmtree(out)
        tmp.rename(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def save(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase | None,
    out: str | Path,
    *,
    extras: Callable[[Path], None] | None = None,
    overwrite: bool = False,
    max_shard_size: str = "2GB",
) -> Path:
    """Save `model` (pruned or dense) and its tokenizer to `out`; `extras(tmp)` may add files."""

    def fill(tmp: Path) -> None:
        config = model.config
        if getattr(config, "layer_shapes", None):
            arch = (getattr(config, "architectures", None) or [type(model).__name__])[0]
            name = pruned_class_name(arch)
            config.architectures = [name]
            config.auto_map = {"AutoModelForCausalLM": f"{MODELING_FILE[:-3]}.{name}"}
            shutil.copyfile(modeling_gapprune.__file__, tmp / MODELING_FILE)
        if is_streamed(model):
            save_streamed(model, tmp)  # layer by layer: one shard per decoder layer
        else:
            model.save_pretrained(tmp, safe_serialization=True, max_shard_size=max_shard_size)
        if tokenizer is not None:
            tokenizer.save_pretrained(tmp)
        if extras is not None:
            extras(tmp)

    return write_atomically(out, fill, overwrite=overwrite)
