"""Where the data folder is: `--data-dir`, else `$GAPPRUNE_DATA` (every reader of local data asks here)."""

from __future__ import annotations

import os
from pathlib import Path

DATA_ENV = "GAPPRUNE_DATA"


def data_dir(explicit: str | Path | None = None) -> Path | None:
    """The data folder: the explicit argument, else `$GAPPRUNE_DATA`, else None."""
    value = explicit or os.environ.get(DATA_ENV)
    return Path(value) if value else None
