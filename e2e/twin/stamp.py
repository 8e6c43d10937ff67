"""The stamp file every built model folder carries (fetched assets and twins alike).

A folder whose stamp has the expected key is not rebuilt; a twin's stamp also says `twin_of`, so
nothing mistakes random weights for the real model.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

STAMP = ".e2e-asset.json"


def stamped(folder: Path, key: str) -> bool:
    """True when `folder` carries a stamp with this key (built already, same inputs)."""
    s = Path(folder) / STAMP
    return s.is_file() and json.loads(s.read_text()).get("key") == key


def write_stamp(folder: Path, key: str, info: dict[str, Any]) -> None:
    (Path(folder) / STAMP).write_text(json.dumps({"key": key, **info}, indent=1) + "\n")


def read_stamp(folder: Path) -> dict[str, Any] | None:
    """The twin stamp of a model folder, or None for anything that is not a twin."""
    p = Path(folder) / STAMP
    try:
        data = json.loads(p.read_text())
    except (OSError, json.JSONDecodeError):
        return None
    return data if data.get("twin_of") else None
