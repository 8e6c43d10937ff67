"""A run folder read once: everything the analysis takes from disk, as one typed record.

RunAnalysis (e2e/analysis/run_analysis.py) computes from a RunRecord alone, so it can be built from
rows in memory as well as from a folder. Reading is all here: the manifest, plan, cells.jsonl and
requests.jsonl as e2e/rundir/store.py reads them, the config the run recorded (typed, read once:
RunRecord.config), the folder's status as a reader should state it, the model's config.json for the
HBM floor, and a warning for a file whose last line is torn.
"""

from __future__ import annotations

from dataclasses import InitVar, dataclass, field
from pathlib import Path
from typing import Any

from e2e.gpu import roofline
from e2e.rundir.formats import CellRowDict, RequestRowDict
from e2e.rundir.manifest_model import RecordedConfig, recorded_config
from e2e.rundir.store import CELLS, MODEL_CONFIG, REQUESTS, RunStore, effective_status


@dataclass(frozen=True)
class RunRecord:
    """What a run folder holds, as read: rows are every row of the file (none left out yet)."""

    root: Path  # the folder read; named in messages
    manifest: dict[str, Any]
    plan: list[dict[str, Any]]
    cells: list[CellRowDict]  # cells.jsonl
    requests: list[RequestRowDict]  # requests.jsonl
    status: Any  # the manifest's status as a reader should state it (`harness-died`)
    model_config: dict[str, Any] | None = None  # the model's config.json (the HBM floor's geometry)
    model_config_missing: str = "no model config.json read"  # why model_config is None
    warnings: tuple[str, ...] = ()  # what reading found (a torn last line)
    # The manifest's `config`, typed: what every reader of the run takes from it (the analysis, the
    # report, compare). `recorded`: it as load() read it; absent (a record built in memory, or replaced),
    # read from `manifest` here, so the two never disagree.
    config: RecordedConfig = field(init=False)
    recorded: InitVar[RecordedConfig | None] = None

    def __post_init__(self, recorded: RecordedConfig | None) -> None:
        config = recorded if recorded is not None else recorded_config(self.manifest, f"{self.root}/manifest.json")
        object.__setattr__(self, "config", config)


def read(run_dir: Path | str) -> RunRecord:
    """Read a run folder (e2e/rundir/store.py's layout); UserError when it is not one."""
    root = Path(run_dir)
    store = RunStore.open_existing(root)
    manifest = store.manifest()
    config = recorded_config(manifest, f"{root}/manifest.json")
    model_config, missing = _model_config(root, manifest, config)
    return RunRecord(
        root=root,
        manifest=manifest,
        plan=store.plan(),
        cells=store.cells(),
        requests=store.requests(),
        # as a reader should state it (harness-died: `running` with nobody holding the folder)
        status=effective_status(root, manifest.get("status")),
        model_config=model_config,
        model_config_missing=missing,
        warnings=tuple(w for f in (CELLS, REQUESTS) if (w := _torn_tail(root / f))),
        recorded=config,
    )


def _model_config(root: Path, manifest: dict[str, Any], config: RecordedConfig) -> tuple[dict[str, Any] | None, str]:
    """The model's config.json as the run folder keeps it (store.MODEL_CONFIG, saved as the run
    started), or None and why not. Never the model's own folder: a report reads nothing outside its
    run folder, so it renders the same on every machine (a clone without assets/ included)."""
    saved = (root / MODEL_CONFIG).parent
    if not saved.is_dir():
        model = (manifest.get("model") or {}).get("path") or config.model.path
        return None, (
            f"the run folder keeps no {MODEL_CONFIG} (a latency run copies it from the model folder "
            f"{model!r} as it starts, when that is local), and no geometry is read from outside the run folder"
        )
    try:
        return roofline.read_model_config(str(saved)), ""
    except roofline.Unavailable as exc:
        return None, str(exc)


def _torn_tail(path: Path) -> str | None:
    """A file whose last line has no newline was cut mid-write (a crash): its rows are read without
    that line, and `--resume` sets it aside to <file>.torn before appending."""
    try:
        with open(path, "rb") as f:
            f.seek(0, 2)
            if f.tell() == 0:
                return None
            f.seek(-1, 2)
            if f.read(1) == b"\n":
                return None
    except OSError:
        return None
    return (
        f"{path.name}: the last line is torn (a crash mid-write): left out; `--resume` sets it aside "
        f"to {path.name}.torn"
    )
