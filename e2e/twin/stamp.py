"""The stamp file every built model folder carries (fetched assets and twins alike), and the rule
for replacing a folder: only one this tool made.

A folder whose stamp has the expected key is not rebuilt; a twin's stamp also says `twin_of`, so
nothing mistakes random weights for the real model. A folder being built carries PARTIAL until it
is renamed into place; the stamp and PARTIAL are how the tool knows a folder is its own, and it
deletes nothing else (`--out ~/thesis` is refused, not emptied).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

from e2e.errors import UserError

STAMP = ".e2e-asset.json"
PARTIAL = ".e2e-partial"  # in a <name>.partial folder while it is built


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


def check_replaceable(folder: Path, what: str) -> None:
    """`folder` may be deleted and rebuilt: it is missing, an empty folder, or one this tool made
    (a stamp or PARTIAL in it). Anything else is the user's: one line, before anything is written."""
    folder = Path(folder)
    if folder.is_symlink():
        raise UserError(f"{what}: is a symlink; not replacing it: give the folder itself or a new one")
    if not folder.exists():
        return
    if not folder.is_dir():
        raise UserError(f"{what}: is not a folder; not replacing it")
    if (folder / STAMP).is_file() or (folder / PARTIAL).is_file() or not any(folder.iterdir()):
        return
    raise UserError(
        f"{what}: not empty and not a folder this tool made (it has no {STAMP}); not deleting "
        "it: give a new or empty folder"
    )


def remove_own(folder: Path, what: str) -> None:
    check_replaceable(folder, what)
    if Path(folder).exists():
        shutil.rmtree(folder)


def partial_of(out: Path) -> Path:
    return Path(out).with_name(Path(out).name + ".partial")


def check_buildable(out: Path, what: str) -> None:
    """A build into `out` would delete nothing of the user's: neither `out` nor its .partial."""
    check_replaceable(out, what)
    check_replaceable(partial_of(out), str(partial_of(out)))


def start_partial(out: Path) -> Path:
    """A fresh <out>.partial marked as the tool's (a previous unfinished build of its own is cleared)."""
    tmp = partial_of(out)
    remove_own(tmp, str(tmp))
    tmp.mkdir()
    (tmp / PARTIAL).write_text("")
    return tmp


def finish_partial(tmp: Path, out: Path, what: str) -> Path:
    """Move a finished build (stamped already) into place, over a folder of the tool's own only."""
    (tmp / PARTIAL).unlink()
    remove_own(out, what)
    os.replace(tmp, out)
    return out
