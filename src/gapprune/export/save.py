"""Write a pruned model as a Hugging Face folder that loads anywhere.

`config.json` keeps the family's config plus `layer_shapes` and an `auto_map` pointing at
`modeling_gapprune.py` (copied beside the weights), so stock transformers loads it with
`trust_remote_code=True` and gapprune loads it without. Everything is written into a temporary
folder next to the target and renamed at the end: a crash never leaves a half-written model.
"""

from __future__ import annotations

import json
import logging
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from transformers import PreTrainedModel, PreTrainedTokenizerBase

from gapprune.models import modeling_gapprune
from gapprune.models.streaming import is_streamed, save_streamed

MODELING_FILE = "modeling_gapprune.py"
logger = logging.getLogger(__name__)


def pruned_class_name(architecture: str) -> str:
    base = architecture.removeprefix("Gappruned")
    if base not in modeling_gapprune.PRUNED_CLASS_FOR_ARCHITECTURE:
        supported = ", ".join(modeling_gapprune.PRUNED_CLASS_FOR_ARCHITECTURE)
        raise ValueError(f"cannot export architecture {architecture!r}; supported: {supported}")
    return modeling_gapprune.PRUNED_CLASS_FOR_ARCHITECTURE[base].__name__


def name_architecture_(config_file: Path, name: str) -> None:
    """Write `name` as the folder's architecture.

    `save_pretrained` writes the in-memory class's name, and a freshly pruned model is still the family's
    class (`LlamaForCausalLM`): engines that pick their model class by that name (vLLM) would build every
    layer at the dense shape. The `Gappruned...` name resolves to gapprune's classes in transformers (through
    `auto_map`), in gapprune and in vLLM (through its plugin).
    """
    config = json.loads(config_file.read_text())
    config["architectures"] = [name]
    config_file.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


def write_atomically(out: str | Path, fill: Callable[[Path], None], *, overwrite: bool = False) -> Path:
    """Create folder `out` by `fill(tmp)` on a temporary sibling folder renamed at the end.

    An existing `out` (with `overwrite`) is renamed aside first and deleted only once the new folder is in
    place, so no failure leaves neither: the old one stays if filling fails, the new one if deleting fails.
    """
    out = Path(out)
    if (out.exists() or out.is_symlink()) and not overwrite:
        raise FileExistsError(f"{out} already exists; choose another output folder or pass overwrite")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        fill(tmp)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    old = None
    if out.exists() or out.is_symlink():
        old = Path(tempfile.mkdtemp(prefix=f".{out.name}.old-", dir=out.parent)) / out.name
        out.rename(old)
    tmp.rename(out)
    if old is not None:
        try:
            if old.is_symlink() or not old.is_dir():
                old.unlink()
            else:
                shutil.rmtree(old)
            old.parent.rmdir()
        except OSError as err:
            logger.warning("wrote %s, but could not delete the folder it replaced, now at %s: %s", out, old, err)
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
        name = None
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
        if name is not None:
            name_architecture_(tmp / "config.json", name)
        if tokenizer is not None:
            tokenizer.save_pretrained(tmp)
        if extras is not None:
            extras(tmp)

    return write_atomically(out, fill, overwrite=overwrite)
