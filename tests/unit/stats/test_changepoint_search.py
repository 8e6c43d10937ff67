"""The change-point search that scales (e2e/stats/changepoints.py): a cheap scan picks the splits the
variance model tests, a test reads the runs nearest its split, and a stretch without a step is said
to hold still only when the splits it doubts most are shown equivalent. (Rates: tests/unit/validation/test_conformance.py;
the timing on 100 to 1000 runs: `python -m e2e.validation.bench_changepoints`, not a test.)"""

from __future__ import annotations

import numpy as np

from e2e.stats import changepoints as cp
from e2e.stats import verdicts as v
from e2e.validation.bench_changepoints import series


def test_a_long_series_finds_both_steps_with_few_model_fits():
    runs = series(150)
    ser = cp._Series(runs, 0.05, 2.0, 0.95, 1)
    steps = cp._steps(ser, list(range(150)))
    assert [(c.index, c.decision) for c in steps] == [(50, v.SLOWER), (100, v.FASTER)]
    assert 1.03 < steps[0].ratio < 1.05 and 0.95 < steps[1].ratio < 0.97
    assert len(ser.tests) < 60  # of 149 splits per segment: the scan's few, not every one
    # each test reads the runs nearest its split: SIDE_CELLS cells a side, not the whole segment
    assert len(steps[0].runs_before) == cp.SIDE_CELLS // 2 and steps[0].runs_before[-1] == 49


def test_a_short_segment_tests_every_split():
    runs = series(7)
    ser = cp._Series(runs, 0.05, 2.0, 0.95, 1)
    assert ser.scan(0, 7, ser.candidates(0, 7)) == [1, 2, 3, 4, 5, 6]


def test_a_stretch_holds_still_only_when_shown_within_the_min_effect():
    rng = np.random.default_rng(3)
    tight = [list(np.log(10.0) + rng.normal(0, 0.001, 4)) for _ in range(6)]
    res = cp.judge_series(tight, 0.05, 2.0, labels=list("abcdef"))
    assert res.steps == [] and [s.decision for s in res.stretches] == [v.EQUIVALENT]
    assert res.decision == v.EQUIVALENT and res.stretches[0].runs == list("abcdef")
    noisy = [list(np.log(10.0) + rng.normal(0, 0.08, 2)) for _ in range(6)]
    res = cp.judge_series(noisy, 0.05, 2.0)
    assert res.steps == [] and res.decision == v.INCONCLUSIVE
    worst = res.stretches[0].worst
    assert worst is not None and worst.decision == v.INCONCLUSIVE
    assert worst.comparison.warnings[-1].startswith("inconclusive: with") and worst.to_dict()["mde_pct"] > 2
    one_server = cp.judge_series([[1.0], [1.0]], 0.05, 2.0)
    assert one_server.decision == v.INSUFFICIENT_REPLICATION and one_server.stretches[0].worst is None


def test_the_stretches_around_a_step_are_judged_apart():
    rng = np.random.default_rng(5)
    runs = [list(np.log(10.0 * (1.1 if i >= 4 else 1.0)) + rng.normal(0, 0.002, 3)) for i in range(8)]
    res = cp.judge_series(runs, 0.05, 2.0)
    assert [c.index for c in res.steps] == [4] and res.decision == v.SLOWER
    assert [(s.runs, s.decision) for s in res.stretches] == [([0, 1, 2, 3], v.EQUIVALENT), ([4, 5, 6, 7], v.EQUIVALENT)]
