"""Scores a kernel's output against the reference: relative L-inf, non-finite and unwritten counts.

Relative L-inf = max |out - ref| / max |ref|: the reference's own scale, so cells at different
context lengths (whose outputs shrink as the softmax spreads) are comparable.

Before each launch the output is filled with a NaN whose payload no kernel produces (canonical NaNs
are 0x7FC0 in bf16 and 0x7E00 in fp16); any element still holding that bit pattern afterwards was
never written. A kernel-produced NaN is counted as non-finite, not as unwritten.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import torch

# Quiet NaNs with a payload: 0x7FD5 (bf16), 0x7E55 (fp16), 0x7FC00055 (fp32).
SENTINEL_BITS = {
    torch.bfloat16: (torch.int16, 0x7FD5),
    torch.float16: (torch.int16, 0x7E55),
    torch.float32: (torch.int32, 0x7FC00055),
}

# Flag (not a pass criterion): well above what rounding to the output dtype and a P cast to the
# value dtype give (each ~eps/2 relative to the output scale), far below what a real fault gives.
TOLERANCE_EPS_MULTIPLE = 2.0


def tolerance(dtype: torch.dtype) -> float:
    return TOLERANCE_EPS_MULTIPLE * torch.finfo(dtype).eps


def poison_output(out: torch.Tensor) -> None:
    """Fill out with the sentinel NaN (in place) so an unwritten element can be told apart."""
    int_dtype, bits = SENTINEL_BITS[out.dtype]
    out.view(int_dtype).fill_(bits)


def unwritten_mask(out: torch.Tensor) -> torch.Tensor:
    int_dtype, bits = SENTINEL_BITS[out.dtype]
    return out.view(int_dtype) == bits


@dataclass(frozen=True)
class Score:
    status: str  # ok | unwritten | nonfinite | over_tolerance
    rel_linf: float | None  # over the written, finite elements; None if there are none
    max_abs_err: float | None
    ref_scale: float
    n_total: int
    n_unwritten: int
    n_nan: int
    n_inf: int
    tolerance: float

    @property
    def faulted(self) -> bool:
        """Did the output show anything wrong at all (what fault injection asks)."""
        return self.status != "ok"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def score(out: torch.Tensor, ref: torch.Tensor, tol: float | None = None) -> Score:
    """Score out (any float dtype) against ref (float32/64, same shape)."""
    if out.shape != ref.shape:
        raise ValueError(f"output shape {tuple(out.shape)} != reference shape {tuple(ref.shape)}")
    tol = tolerance(out.dtype) if tol is None else tol
    unwritten = unwritten_mask(out)
    o = out.double()
    r = ref.double()
    written = ~unwritten
    nan = torch.isnan(o) & written
    inf = torch.isinf(o) & written
    finite = written & ~nan & ~inf
    ref_scale = float(r.abs().max()) if r.numel() else 0.0
    n_fin = int(finite.sum())
    err: float | None
    rel: float | None
    if n_fin:
        err = float((o - r).abs()[finite].max())
        rel = err / ref_scale if ref_scale > 0 else (0.0 if err == 0 else math.inf)
    else:
        err = rel = None
    n_unw, n_nan, n_inf = int(unwritten.sum()), int(nan.sum()), int(inf.sum())
    if n_unw:
        status = "unwritten"
    elif n_nan or n_inf:
        status = "nonfinite"
    elif rel is not None and rel > tol:
        status = "over_tolerance"
    else:
        status = "ok"
    return Score(status, rel, err, ref_scale, out.numel(), n_unw, n_nan, n_inf, tol)
