"""Stage values that save as JSON: one `save`/`load` pair for every number-only value of the pipeline."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, ClassVar, TypeVar

from typing_extensions import Self

T = TypeVar("T", bound="JsonValue")


class JsonValue:
    """Mixin for dataclasses with `to_dict`/`from_dict`: writes one JSON file, reads it back with a clear error."""

    file_kind: ClassVar[str] = "file"
    json_indent: ClassVar[int | None] = None

    def to_dict(self) -> dict[str, Any]:
        raise NotImplementedError

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Self:
        raise NotImplementedError

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=self.json_indent) + "\n")

    @classmethod
    def load(cls, path: str | Path) -> Self:
        try:
            return cls.from_dict(json.loads(Path(path).read_text()))
        except (OSError, KeyError, TypeError, ValueError) as err:
            raise ValueError(f"{path} is not a readable {cls.file_kind} ({err}); measure it again") from None
