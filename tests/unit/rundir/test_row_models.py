"""The rows' two descriptions stay one: each TypedDict that rows cross stages as (e2e/rundir/rows.py,
e2e/rundir/formats.py) names exactly the fields of the pydantic model that checks the row, plus the fields
a row carries unchecked, with the same required ones; and what a cell's rounds emit is a MeasuredRow."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import BaseModel

from e2e.design.config import WorkloadCfg
from e2e.run import metrics
from e2e.run.measure import run_rounds
from e2e.rundir import formats, rows


def _fields(model: type[BaseModel]) -> tuple[set[str], set[str]]:
    """(every field, the required ones), by the name a row on disk uses (`pass`, not `pass_`)."""
    names = {n: f.alias or n for n, f in model.model_fields.items()}
    return set(names.values()), {names[n] for n, f in model.model_fields.items() if f.is_required()}


def drift(model: type[BaseModel], typed: Any, unchecked: frozenset[str] = frozenset()) -> list[str]:
    """What differs between a pydantic model and its TypedDict; [] when they agree."""
    fields, required = _fields(model)
    keys = set(typed.__required_keys__) | set(typed.__optional_keys__)
    out = [f"{model.__name__}.{k} is not in {typed.__name__}" for k in sorted(fields - keys)]
    out += [f"{typed.__name__}.{k} is neither checked nor unchecked" for k in sorted(keys - fields - unchecked)]
    out += [f"{k}: in {model.__name__} and unchecked" for k in sorted(fields & unchecked)]
    if required != set(typed.__required_keys__):
        out.append(f"required: {sorted(required)} in the model, {sorted(typed.__required_keys__)} in the TypedDict")
    return out


@pytest.mark.parametrize(
    ("model", "typed", "unchecked"),
    [
        (formats.RequestRow, formats.RequestRowDict, rows.UNCHECKED),
        (formats.CellRow, formats.CellRowDict, formats.CELL_UNCHECKED),
        (formats.RoundRequest, formats.RoundRequestDict, frozenset()),
    ],
)
def test_typed_rows_name_the_models_fields(model: type[BaseModel], typed: Any, unchecked: frozenset[str]) -> None:
    assert drift(model, typed, unchecked) == []


def test_a_field_added_to_one_side_only_is_caught() -> None:
    class Wider(formats.RequestRow):
        new_field: int | None = None

    class WiderDict(formats.CellRowDict, total=False):
        new_field: int

    assert drift(Wider, formats.RequestRowDict, rows.UNCHECKED) == ["Wider.new_field is not in RequestRowDict"]
    assert drift(formats.CellRow, WiderDict, formats.CELL_UNCHECKED) == [
        "WiderDict.new_field is neither checked nor unchecked"
    ]


def test_the_emitted_row_is_a_measured_row() -> None:
    """run_rounds emits the round's fields and what `one` measured; every key is one MeasuredRow names
    (a client's row: its time, usage and the server's histograms, e2e/run/metrics.py)."""
    measured = {"t_start_unix": 1.0, "t_client_s": 0.5, "prompt_tokens": 16, "completion_tokens": 8}
    measured |= {"finish_reason": "length", **dict.fromkeys(metrics.HISTOGRAMS, 0.1)}
    emitted: list[dict[str, Any]] = []
    wl = WorkloadCfg(depths=(16,), long_tokens=8, short_tokens=2, rounds=1, warmup_rounds=0)
    run_rounds(wl, lambda n: (dict(measured), None), lambda r: emitted.append(dict(r)), lambda p: None)
    keys = set(formats.MeasuredRow.__required_keys__) | set(formats.MeasuredRow.__optional_keys__)
    assert len(emitted) == 2
    assert [sorted(set(r) - keys) for r in emitted] == [[], []]
    assert {"n_tokens", "round", "position", "valid", "invalid_reason"} <= set(emitted[0])
