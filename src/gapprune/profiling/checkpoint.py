"""Per-layer checkpoints of a loss table being measured, so a killed run resumes where it stopped.

Rows are keyed by everything that decides their values (model fingerprint, calibration tokens,
criterion, metric, option grid); a different run never reads them. Each row is written to a
temporary file and renamed, so a kill leaves whole rows or none.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path
from typing import Any

from gapprune.output import write_file_atomically

Row = dict[str, dict[int, float]]  # component -> option index -> ΔL


def run_key(parts: dict[str, Any], *tensors_bytes: bytes) -> str:
    """A short hash of the run's defining settings and data."""
    digest = hashlib.sha256(json.dumps(parts, sort_keys=True).encode())
    for blob in tensors_bytes:
        digest.update(blob)
    return digest.hexdigest()[:20]


class LayerCheckpoint:
    """Rows of one table under `root/key/`: `layer_<l>.json`, written atomically."""

    def __init__(self, root: str | Path, key: str) -> None:
        self.folder = Path(root) / key

    def save(self, layer: int, row: Row) -> None:
        data = {c: {str(k): v for k, v in values.items()} for c, values in row.items()}
        write_file_atomically(self.folder / f"layer_{layer}.json", json.dumps(data))

    def load(self) -> dict[int, Row]:
        """Every complete row saved so far (unreadable ones are skipped and measured again)."""
        rows: dict[int, Row] = {}
        if not self.folder.is_dir():
            return rows
        for path in sorted(self.folder.glob("layer_*.json")):
            try:
                data = json.loads(path.read_text())
                rows[int(path.stem.removeprefix("layer_"))] = {
                    c: {int(k): float(v) for k, v in values.items()} for c, values in data.items()
                }
            except (OSError, ValueError):
                continue
        return rows

    def clear(self) -> None:
        shutil.rmtree(self.folder, ignore_errors=True)


Measured = dict[int, dict[str, dict[int, float]]]  # layer -> component -> option index -> ΔL


class EntryCheckpoint:
    """The auto profiler's progress under `root/key/`: the screen table and every exact entry measured.

    A resumed run replays the same rounds (they are a function of the screen and the values
    measured), taking each value from here instead of replaying it, so it ends with the same
    table and plan as a run that was never killed.
    """

    def __init__(self, root: str | Path, key: str) -> None:
        self.folder = Path(root) / key

    def _write(self, name: str, data: Any) -> None:
        write_file_atomically(self.folder / name, json.dumps(data))

    def save_screen(self, table: dict[str, Any]) -> None:
        self._write("screen.json", table)

    def load_screen(self) -> dict[str, Any] | None:
        try:
            return json.loads((self.folder / "screen.json").read_text())
        except (OSError, ValueError):
            return None

    def save_round(self, values: Measured) -> None:
        """One round's new exact values, in a file of its own (a kill loses at most the round in flight)."""
        done = len(list(self.folder.glob("round_*.json"))) if self.folder.is_dir() else 0
        data = {str(layer): {c: {str(k): v for k, v in ks.items()} for c, ks in per.items()}
                for layer, per in values.items()}
        self._write(f"round_{done:03d}.json", data)

    def load_entries(self) -> Measured:
        entries: Measured = {}
        if not self.folder.is_dir():
            return entries
        for path in sorted(self.folder.glob("round_*.json")):
            try:
                data = json.loads(path.read_text())
            except (OSError, ValueError):
                continue
            for layer, per in data.items():
                for c, ks in per.items():
                    entries.setdefault(int(layer), {}).setdefault(c, {}).update(
                        {int(k): float(v) for k, v in ks.items()})
        return entries

    def clear(self) -> None:
        shutil.rmtree(self.folder, ignore_errors=True)
