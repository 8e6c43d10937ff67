"""The differencing estimator and row validation, on constructed rows."""

from __future__ import annotations

import pytest

from e2e.run.measure import check_row
from e2e.stats.estimate import cell_estimate


def row(n, t, valid=True, decode=None, e2e=None):
    return {"n_tokens": n, "t_client_s": t, "valid": valid, "server_decode_s": decode, "server_e2e_s": e2e}


def test_differenced_median():
    rows = [row(64, 1.00), row(64, 1.10), row(64, 5.0), row(8, 0.30), row(8, 0.32), row(8, 0.10)]
    est = cell_estimate(rows, 64, 8)
    # medians: 1.10 and 0.30 -> 0.8 s over 56 tokens
    assert est["decode_ms_per_token"] == pytest.approx(800 / 56)
    assert est["n_valid_long"] == 3 and est["n_valid_short"] == 3


def test_invalid_rows_are_never_used():
    rows = [row(64, 1.0), row(64, 99.0, valid=False), row(8, 0.2), row(8, 0.0, valid=False)]
    est = cell_estimate(rows, 64, 8)
    assert est["decode_ms_per_token"] == pytest.approx(800 / 56)
    assert est["n_invalid"] == 2


def test_server_side_and_overhead():
    rows = [row(64, 1.0, decode=0.63, e2e=0.999), row(8, 0.3, decode=0.07, e2e=0.2985)]
    est = cell_estimate(rows, 64, 8)
    assert est["server_decode_ms_per_token"] == pytest.approx(560 / 56)
    assert est["server_itl_ms"] == pytest.approx(10.0)
    assert est["client_overhead_ms_median"] == pytest.approx(1.25)


def test_no_valid_rows_gives_no_estimate():
    assert cell_estimate([row(64, 1.0, valid=False)], 64, 8)["decode_ms_per_token"] is None


@pytest.mark.parametrize(
    "r, why",
    [
        ({"prompt_tokens": 255, "completion_tokens": 64, "finish_reason": "length"}, "prompt_tokens 255"),
        ({"prompt_tokens": 256, "completion_tokens": 63, "finish_reason": "length"}, "completion_tokens 63"),
        ({"prompt_tokens": 256, "completion_tokens": 64, "finish_reason": "stop"}, "finish_reason 'stop'"),
        ({"error": "HTTP 500: boom"}, "HTTP 500"),
    ],
)
def test_row_validation(r, why):
    assert why in check_row(r, 256, 64)
    assert check_row({"prompt_tokens": 256, "completion_tokens": 64, "finish_reason": "length"}, 256, 64) is None
