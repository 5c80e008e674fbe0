"""Output paths checked before any work: a run that cannot write its result should fail in its first
second, not after an hour of profiling; and result files written whole or not at all (folders: `save.write_atomically`)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Literal


def check_output(out: str | Path, *, overwrite: bool, kind: Literal["folder", "file"] = "folder",
                 flag: str = "--out") -> None:
    """Refuse an output that exists (without `overwrite`), is the wrong kind, or lies where nothing can be written.

    Raises:
        FileExistsError: `out` exists and `overwrite` is false.
        ValueError: `out` is a file where a folder is wanted (or the reverse), a parent is a file, or
            the nearest existing parent folder cannot be written to.
    """
    out = Path(out)
    if out.exists():
        if not overwrite:
            raise FileExistsError(f"{out} already exists; choose another {flag} or pass --overwrite")
        if kind == "folder" and not out.is_dir():
            raise ValueError(f"{out} is a file, not a folder; choose another {flag}")
        if kind == "file" and out.is_dir():
            raise ValueError(f"{out} is a folder, not a file; choose another {flag}")
    parent = out.absolute().parent
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        raise ValueError(f"{parent} is a file, so {out} cannot be created under it; choose another {flag}")
    try:
        Path(tempfile.mkdtemp(prefix=".gapprune-write-check-", dir=parent)).rmdir()
    except OSError as err:
        raise ValueError(f"cannot write {out}: {err.strerror or err} in {parent}; choose another {flag}") from None


def write_file_atomically(path: str | Path, text: str) -> None:
    """Write `text` to `path` through a temporary sibling renamed over it, creating missing parent folders:
    an evaluation of hours must not end in a missing folder or leave half a JSON file when killed while writing."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, tmp = tempfile.mkstemp(prefix=f".{path.name}.tmp-", dir=path.parent)
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
