"""What a counted kernel call was called with (the kernel's own arguments: head size, heads, block
size, window, dtypes), and the stand-in that counts launches of a Triton kernel."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol


class Counts(Protocol):
    """Where a counted call goes (the recorder)."""

    def count(self, path: str, args: str = "") -> None: ...


def _dtype(x: Any) -> str | None:
    return None if x is None else str(x).removeprefix("torch.")


def custom_op_args(args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
    # paged_attention_rocm(out, exp_sums, max_logits, tmp_out, query, key_cache, value_cache,
    #                      num_kv_heads, scale, block_tables, seq_lens, query_start_loc, block_size,
    #                      max_seq_len, alibi_slopes, kv_cache_dtype, ...)  (0.23.0 to 0.32.0 alike)
    try:
        q: Any = args[4] if len(args) > 4 else kwargs.get("query")  # None: no shape, "?" below
        kvh = args[7] if len(args) > 7 else kwargs.get("num_kv_heads")
        bs = kwargs.get("block_size", args[12] if len(args) > 12 else None)
        kvd = kwargs.get("kv_cache_dtype", args[15] if len(args) > 15 else None)
        return f"h{q.shape[2]} q{q.shape[1]}/kv{kvh} bs{bs} {_dtype(q.dtype)} kv:{kvd}"
    except Exception:
        return "?"


class CountedKernel:
    """Stands in for a Triton JITFunction: `kernel[grid](...)` counts, then launches the real one."""

    def __init__(self, kernel: Any, rec: Counts, path: str) -> None:
        self._kernel = kernel
        self._rec = rec
        self._path = path

    def __getitem__(self, grid: Any) -> Callable[..., Any]:
        launch = self._kernel[grid]
        rec, path = self._rec, self._path

        def counted(*args: Any, **kwargs: Any) -> Any:
            rec.count(path, triton_args(kwargs))
            return launch(*args, **kwargs)

        return counted

    def __getattr__(self, item: str) -> Any:
        return getattr(self._kernel, item)


def triton_args(kw: dict[str, Any]) -> str:
    try:
        q = kw["query_ptr"]
        kv = kw.get("key_cache_ptr")
        sw = kw.get("SLIDING_WINDOW") or "-"
        return (
            f"h{kw.get('HEAD_SIZE')} q{kw.get('num_query_heads')}/kv"
            f"{kw.get('num_query_heads', 0) // max(1, kw.get('num_queries_per_kv', 1))} "
            f"bs{kw.get('PHYSICAL_BLOCK_SIZE', kw.get('BLOCK_SIZE'))} sw{sw} {_dtype(q.dtype)} "
            f"kv:{_dtype(getattr(kv, 'dtype', None))}"
        )
    except Exception:
        return "?"
