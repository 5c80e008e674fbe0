"""Text sources and token windows. To add a named data set, add an entry to `TEXT_SETS`."""

from gapprune.data.selfgen import self_generated_windows
from gapprune.data.sources import DATA_ENV, TEXT_SETS, check_source, load_text, read_text_file, split_for
from gapprune.data.text import (
    bos_token_id,
    consecutive_windows,
    held_out_windows,
    mixed_windows,
    sample_windows,
    tokenize_text,
)

__all__ = [
    "DATA_ENV",
    "TEXT_SETS",
    "bos_token_id",
    "check_source",
    "consecutive_windows",
    "held_out_windows",
    "load_text",
    "mixed_windows",
    "read_text_file",
    "sample_windows",
    "self_generated_windows",
    "split_for",
    "tokenize_text",
]
