"""What the report says of a resumed run. The wall clock: one harness session from start to end; a
resumed run counts each session (a dead harness's to its last cell row) and leaves out the hours
between the death and the resume (the 0.23.0 H200 run died at 18:58 one evening and was resumed at
09:44 the next morning). The start table: a later start that missed the compile cache (a resume on
another machine) is not credited to the cache."""

from e2e.analysis.wall_clock import wall_clock_sessions
from e2e.report.md_facts import _gpu_time
from tests.support import ROOT


def _row(cid: str, finished: str) -> dict:
    return {"cell_id": cid, "status": "ok", "finished": finished}


def test_one_session_is_start_to_end():
    m = {"started": "2026-12-02T18:00:00+00:00", "ended": "2026-12-02T18:10:30+00:00"}
    wall, n, gap = wall_clock_sessions(m, [_row("a", "2026-12-02T18:05:00+00:00")])
    assert (wall, n, gap) == (630.0, 1, 0.0)


def test_a_resumed_run_counts_each_session_and_not_the_gap():
    m = {
        "started": "2026-12-02T18:49:11+00:00",
        "ended": "2026-12-03T09:48:05+00:00",
        "resumes": [{"started": "2026-12-03T09:44:05+00:00"}],
    }
    rows = [
        _row("p1", "2026-12-02T18:51:31+00:00"),
        _row("p2", "2026-12-02T18:58:26+00:00"),
        _row("p3", "2026-12-03T09:47:58+00:00"),
    ]
    span = 14 * 3600 + 58 * 60 + 54  # 18:49:11 to 09:48:05 the next day
    wall, n, gap = wall_clock_sessions(m, rows)
    assert n == 2
    assert wall == (9 * 60 + 15) + 4 * 60  # 18:49:11-18:58:26, then 09:44:05-09:48:05
    assert wall + gap == span and gap > 14 * 3600
    line = _gpu_time(
        {
            "cells_minutes": 12.7,
            "starts_minutes": 8.3,
            "warmup_minutes": 0.7,
            "measure_minutes": 3.7,
            "wall_minutes": wall / 60,
            "harness_sessions": n,
            "wall_not_counted_minutes": gap / 60,
        }
    )
    assert line.startswith("13.2 min wall clock in 2 harness sessions")
    assert f"{(span - wall) / 60:.1f} min between them not counted" in line


def test_a_session_that_died_before_any_row_counts_nothing():
    m = {
        "started": "2026-12-02T10:00:00+00:00",
        "ended": "2026-12-02T12:01:00+00:00",
        "resumes": [{"started": "2026-12-02T12:00:00+00:00"}],
    }
    wall, n, gap = wall_clock_sessions(m, [_row("a", "2026-12-02T12:00:50+00:00")])
    assert (wall, n, gap) == (60.0, 2, 7200.0)


def test_no_times_no_wall_clock():
    assert wall_clock_sessions({}, []) == (None, 1, None)
    assert "wall clock" not in _gpu_time(
        {
            "cells_minutes": 1.0,
            "starts_minutes": 0.5,
            "warmup_minutes": 0.1,
            "measure_minutes": 0.4,
            "wall_minutes": None,
        }
    )


def test_the_start_table_credits_the_cache_only_with_starts_that_hit_it():
    """The committed 0.23.0 H200 run: stock's second server ran cold on another machine after a
    resume (its log says the cache missed, 164.5 s against the first's 128.5 s): no saving is
    claimed for stock; widened's warm start (hit) saved 56.4 s."""

    from e2e.analysis.run_analysis import RunAnalysis

    run = ROOT / "results" / "h200-vllm023-tp1"
    rows = {r["arm"]: r for r in RunAnalysis(run).startup_table()}
    assert rows["stock"]["later_cache_misses"] == 1 and rows["stock"]["saved_per_start_s"] is None
    assert round(rows["stock"]["later_median_s"], 1) == 164.5
    assert rows["widened"]["later_cache_misses"] == 0
    assert round(rows["widened"]["saved_per_start_s"], 1) == round(131.0 - 74.6, 1)
