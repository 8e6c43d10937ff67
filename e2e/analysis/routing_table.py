"""The run's routing summary from the cells' plugin records (the `routing` of each cell row)."""

from __future__ import annotations

from typing import Any


def _row(arm: str, kind: str, what: str, path: Any, n_layers: Any, graphs: list[str]) -> dict[str, Any]:
    return {
        "arm": arm,
        "kind": kind,
        "what": what,
        "path": path,
        "n_layers": n_layers,
        "processes": set(),
        "cells": [],
        "graphs": graphs,
    }


def routing_table(cell_rows: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """Per arm and layer class, which attention path it took, on how many layers, in which processes
    (and the gate's answers). Arms whose cells agree collapse to one row; a disagreement between
    cells shows as two rows. cell_rows: cell id -> its row."""
    rows: dict[tuple[Any, ...], dict[str, Any]] = {}
    for cid, c in cell_rows.items():
        r = c.get("routing")
        if not isinstance(r, dict):
            continue
        for lc in r.get("layer_classes") or []:
            key = (c["arm"], "layers", lc["layer_class"], lc.get("path"), lc.get("n_layers"))
            graphs = sorted(set(r.get("cudagraph_modes") or []))
            row = rows.setdefault(
                key, _row(c["arm"], "layer class", lc["layer_class"], lc.get("path"), lc.get("n_layers"), graphs)
            )
            row["processes"].update(p.split(" pid ")[0] for p in lc.get("processes") or [])
            row["cells"].append(cid)
        for g in r.get("gate") or []:
            what = (
                f"gate(gqa={g.get('gqa_ratio')}, head={g.get('head_size')}, block={g.get('block_size')}, "
                f"window={g.get('sliding_window')})"
            )
            key = (c["arm"], "gate", what, g.get("answer"), None)
            row = rows.setdefault(key, _row(c["arm"], "gate", what, f"answer {g.get('answer')}", None, []))
            row["processes"].update(p.split(" pid ")[0] for p in g.get("processes") or [])
            row["cells"].append(cid)
    return [{**v, "processes": sorted(v["processes"])} for v in rows.values()]
