"""Output paths checked before any work: a run that cannot write its result should fail in its first
second, not after an hour of profiling (the writes themselves stay atomic, `save.write_atomically`)."""

from __future__ import annotations

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
