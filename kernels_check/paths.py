"""The kernel paths, driven the way vLLM drives them, and proof of which one ran.

- "rocm_custom" and "triton": vLLM's own `chunked_prefill_paged_decode` (ROCM_ATTN's decode
  dispatch), identical arguments, with only `use_rocm_custom_paged_attention`'s answer forced on or
  off through the project's patch mechanism (e2e.plugin.patches.apply_patches, names
  "gate-always-on" / "gate-always-off"). `force_gate` is the only coupling to that mechanism.
- "fa3": vLLM's FlashAttention 3 (`vllm.vllm_flash_attn.flash_attn_varlen_func`, fa_version=3)
  over the same K/V paged into FLASH_ATTN's layout, through a block table, called with the
  arguments FlashAttentionImpl.forward passes for decode. Used where the ROCm custom op does not
  exist (NVIDIA), as the non-Triton comparator.

Which path ran is counted by wrapping the ops the dispatch calls (module attributes it looks up at
call time): `vllm._custom_ops.paged_attention_rocm`, the module global `kernel_paged_attention_2d`
and `context_attention_fwd` (the prefill branch; must stay at zero for pure decode).
"""

from __future__ import annotations

import inspect
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch

from e2e.errors import UserError
from e2e.plugin.contract import GATE_OFF, GATE_ON

DISPATCH_MODULE = "vllm.v1.attention.ops.chunked_prefill_paged_decode"
GATE_PATCH = {True: GATE_ON, False: GATE_OFF}
# What each dispatch path must have counted for one decode launch.
EXPECTED_COUNTS = {
    "triton": {"triton_2d": 1, "rocm_custom": 0, "prefill": 0},
    "rocm_custom": {"triton_2d": 0, "rocm_custom": 1, "prefill": 0},
}


# -- vLLM modules --------------------------------------------------------------------------------
@dataclass
class Vllm:
    version: str
    dispatch_mod: Any  # vllm.v1.attention.ops.chunked_prefill_paged_decode
    custom_ops: Any  # vllm._custom_ops
    rocm: Any  # vllm.platforms.rocm
    dispatch_signature: str


def import_vllm() -> Vllm:
    """Import the vLLM pieces the check drives; a clear error if this vLLM lacks them."""
    try:
        import importlib

        import vllm

        dispatch_mod = importlib.import_module(DISPATCH_MODULE)
        from vllm import _custom_ops
        from vllm.platforms import rocm
    except Exception as exc:  # ImportError, or a vLLM that fails to initialise
        raise UserError(
            f"cannot import vLLM's paged-decode dispatch ({DISPATCH_MODULE}): {type(exc).__name__}: {exc}"
        ) from None
    for mod, name in (
        (dispatch_mod, "chunked_prefill_paged_decode"),
        (dispatch_mod, "kernel_paged_attention_2d"),
        (_custom_ops, "paged_attention_rocm"),
        (rocm, "use_rocm_custom_paged_attention"),
    ):
        if not hasattr(mod, name):
            raise UserError(
                f"vLLM {vllm.__version__}: {mod.__name__}.{name} does not exist; "
                "kernels_check was written against vLLM 0.26.0"
            )
    sig = str(inspect.signature(dispatch_mod.chunked_prefill_paged_decode))
    return Vllm(vllm.__version__, dispatch_mod, _custom_ops, rocm, sig)


def rocm_op_registered() -> tuple[bool, str]:
    """Is vLLM's ROCm custom paged-attention op registered in this process? Registered is not yet
    available: sweep.rocm_custom_launches launches it once before the run calls it that."""
    try:
        torch.ops._rocm_C.paged_attention  # noqa: B018  (lookup raises when not registered)
        return True, "torch.ops._rocm_C.paged_attention is registered"
    except (AttributeError, RuntimeError) as exc:
        return False, (
            "the ROCm custom paged-attention kernel was not available on this machine "
            f"(torch.ops._rocm_C.paged_attention: {type(exc).__name__})"
        )


def fa3_available() -> tuple[bool, str]:
    try:
        from vllm.vllm_flash_attn import fa_version_unsupported_reason, is_fa_version_supported
    except Exception as exc:
        return False, f"vllm.vllm_flash_attn not importable: {type(exc).__name__}: {exc}"
    if is_fa_version_supported(3):
        return True, "FA3 (vllm.vllm_flash_attn, fa_version=3)"
    return False, str(fa_version_unsupported_reason(3))


def native_gate(v: Vllm, dtype: torch.dtype, head_size: int, block_size: int, ratio: int, max_seq_len: int) -> bool:
    """The gate's own answer on this machine (call before any patch is applied)."""
    return bool(
        v.rocm.use_rocm_custom_paged_attention(dtype, head_size, block_size, ratio, max_seq_len, 0, "auto", None, None)
    )


# -- the gate, through the project's patch mechanism ---------------------------------------------
def patch_mechanism() -> Callable[[list[str]], list[str]]:
    try:
        from e2e.plugin.patches import apply_patches
    except Exception as exc:
        raise UserError(
            "e2e.plugin.patches.apply_patches is not importable "
            f"({type(exc).__name__}: {exc}); kernels_check forces the gate only "
            "through the project's patch mechanism"
        ) from None
    return apply_patches


def force_gate(v: Vllm, on: bool, probe: tuple[torch.dtype, int, int, int, int]) -> list[str]:
    """Force use_rocm_custom_paged_attention's answer to `on`, then check that the dispatch's
    lookup (`vllm.platforms.rocm.use_rocm_custom_paged_attention`, imported inside the dispatch on
    every call) now answers `on` for this cell's arguments. probe = (dtype, head, block, ratio,
    max_seq_len). Raises RuntimeError if the patch did not take."""
    applied = patch_mechanism()([GATE_PATCH[on]])
    dtype, head, block, ratio, max_len = probe
    got = bool(v.rocm.use_rocm_custom_paged_attention(dtype, head, block, ratio, max_len, 0, "auto", None, None))
    if got != on:
        raise RuntimeError(f"apply_patches([{GATE_PATCH[on]!r}]) returned {applied!r} but the gate still answers {got}")
    return list(applied or [])


# -- counting which op ran -----------------------------------------------------------------------
class _CountingKernel:
    """Stands in for a Triton JITFunction launched as kernel[grid](**kwargs)."""

    def __init__(self, inner: Any, counts: Counter[str], key: str):
        self._inner, self._counts, self._key = inner, counts, key

    def __getitem__(self, grid: Any) -> Callable[..., Any]:
        launcher = self._inner[grid]

        def launch(*args: Any, **kwargs: Any) -> Any:
            self._counts[self._key] += 1
            return launcher(*args, **kwargs)

        return launch

    def __getattr__(self, name: str) -> Any:  # anything else (e.g. .fn, .cache) goes to the kernel
        return getattr(self._inner, name)


def _counting_fn(inner: Callable[..., Any], counts: Counter[str], key: str) -> Callable[..., Any]:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        counts[key] += 1
        return inner(*args, **kwargs)

    vars(wrapper)["__wrapped__"] = inner
    return wrapper


@dataclass
class OpCounter:
    """Wraps the ops the dispatch may call; `counts` holds calls since install."""

    counts: Counter[str] = field(default_factory=Counter)
    _undo: list[tuple[Any, str, Any]] = field(default_factory=list)  # (module, name, original)

    def install(self, dispatch_mod: Any, custom_ops: Any) -> None:
        for mod, name, key, kind in (
            (dispatch_mod, "kernel_paged_attention_2d", "triton_2d", "kernel"),
            (dispatch_mod, "context_attention_fwd", "prefill", "fn"),
            (custom_ops, "paged_attention_rocm", "rocm_custom", "fn"),
        ):
            orig = getattr(mod, name)
            wrapped = (
                _CountingKernel(orig, self.counts, key) if kind == "kernel" else _counting_fn(orig, self.counts, key)
            )
            setattr(mod, name, wrapped)
            self._undo.append((mod, name, orig))

    def uninstall(self) -> None:
        while self._undo:
            mod, name, orig = self._undo.pop()
            setattr(mod, name, orig)

    @contextmanager
    def delta(self) -> Iterator[dict[str, int]]:
        """Yields a dict filled, on exit, with the calls made inside the block."""
        before = Counter(self.counts)
        out: dict[str, int] = {}
        try:
            yield out
        finally:
            after = self.counts
            out.update({k: after.get(k, 0) - before.get(k, 0) for k in ("triton_2d", "rocm_custom", "prefill")})


# -- launches ------------------------------------------------------------------------------------
@dataclass
class DecodeInputs:
    """One cell's device tensors, shared by every path."""

    query: torch.Tensor  # [seqs, q_heads, head]
    key: torch.Tensor  # [seqs, kv_heads, head]: the step's new token (already cached)
    value: torch.Tensor
    key_cache: torch.Tensor  # ROCm layout
    value_cache: torch.Tensor
    block_table: torch.Tensor  # int32 [seqs, max_blocks]
    seq_lens: torch.Tensor  # int32 [seqs]
    query_start_loc: torch.Tensor  # int32 [seqs + 1]: 0, 1, ..., seqs
    max_seq_len: int
    scale: float
    k_scale: torch.Tensor  # float32 scalar 1.0 (layer._k_scale for an unquantized cache)
    v_scale: torch.Tensor
    fa_key_cache: torch.Tensor | None = None  # FLASH_ATTN layout, same data
    fa_value_cache: torch.Tensor | None = None


def dispatch_launch(v: Vllm, x: DecodeInputs, out: torch.Tensor) -> Callable[[], None]:
    """A closure calling vLLM's chunked_prefill_paged_decode as RocmAttentionImpl.forward does for a
    decode-only batch (kv_cache_dtype "auto", no alibi, no sliding window, no sinks)."""
    fn = v.dispatch_mod.chunked_prefill_paged_decode

    def launch() -> None:
        fn(
            query=x.query,
            key=x.key,
            value=x.value,
            output=out,
            kv_cache_dtype="auto",
            key_cache=x.key_cache,
            value_cache=x.value_cache,
            block_table=x.block_table,
            query_start_loc=x.query_start_loc,
            seq_lens=x.seq_lens,
            max_seq_len=x.max_seq_len,
            max_query_len=1,
            k_scale=x.k_scale,
            v_scale=x.v_scale,
            alibi_slopes=None,
            sliding_window=None,
            sm_scale=x.scale,
            output_scale=None,
            sinks=None,
        )

    return launch


def fa3_launch(flash_attn_varlen_func: Callable[..., Any], x: DecodeInputs, out: torch.Tensor) -> Callable[[], None]:
    """A closure calling FA3 (vllm.vllm_flash_attn.flash_attn_varlen_func) as FlashAttentionImpl.forward
    does for decode: varlen with one query per sequence, seqused_k = seq_lens, block table, causal
    (bottom-right aligned: sees all keys)."""
    if x.fa_key_cache is None:
        raise RuntimeError("no FLASH_ATTN-layout cache was built for this cell")

    def launch() -> None:
        flash_attn_varlen_func(
            q=x.query,
            k=x.fa_key_cache,
            v=x.fa_value_cache,
            out=out,
            cu_seqlens_q=x.query_start_loc,
            max_seqlen_q=1,
            seqused_k=x.seq_lens,
            max_seqlen_k=x.max_seq_len,
            softmax_scale=x.scale,
            causal=True,
            block_table=x.block_table,
            fa_version=3,
        )

    return launch


# -- our cache layouts against vLLM's own --------------------------------------------------------
def vllm_config_context() -> Any:
    """vLLM's config context with a default config: what vLLM's own kernel tests run under. FlashAttention's
    stride order reads the KV cache layout from the current config (vLLM 0.26.0:
    get_kv_cache_layout -> get_kv_connector_cache_layout -> get_current_vllm_config), which raises
    outside one. set_current_vllm_config is a context manager in 0.26.0 and 0.32.0 alike."""
    from vllm.config import VllmConfig, set_current_vllm_config

    return set_current_vllm_config(VllmConfig())


def vllm_kv_cache(
    backend: Any, num_blocks: int, block: int, kv_heads: int, head: int, dtype: torch.dtype, device: Any
) -> torch.Tensor:
    """A layer's KV cache as vLLM 0.26.0's model runner hands it to the backend: the backend's logical
    shape, stored in its stride order (identity when it names none), permuted back to logical
    (vllm/v1/worker/gpu/attn_utils.py::_reshape_attention_kv_cache, unpadded pages)."""
    shape = tuple(backend.get_kv_cache_shape(num_blocks, block, kv_heads, head))
    try:
        order = tuple(backend.get_kv_cache_stride_order())
    except (AttributeError, NotImplementedError):
        order = tuple(range(len(shape)))
    phys = torch.empty([shape[i] for i in order], dtype=dtype, device=device)
    return phys.permute(*[order.index(i) for i in range(len(order))])


def same_views(mine: tuple[torch.Tensor, ...], theirs: tuple[torch.Tensor, ...]) -> bool:
    """Do two (key, value) views address the same elements of equally sized storages?"""
    return all(
        a.shape == b.shape
        and a.stride() == b.stride()
        and a.storage_offset() == b.storage_offset()
        and a.untyped_storage().nbytes() == b.untyped_storage().nbytes()
        for a, b in zip(mine, theirs, strict=True)
    )


def _describe_views(views: tuple[torch.Tensor, ...]) -> str:
    return ", ".join(f"{tuple(t.shape)} stride {t.stride()} offset {t.storage_offset()}" for t in views)


def check_layout(mine: tuple[torch.Tensor, ...], theirs: tuple[torch.Tensor, ...], how: str) -> str:
    if same_views(mine, theirs):
        return f"same as {how}"
    return f"DIFFERENT from {how}: vLLM {_describe_views(theirs)}; ours {_describe_views(mine)}"


def rocm_layout(
    backend: Any,
    split: Callable[..., tuple[torch.Tensor, torch.Tensor]],
    dtype: torch.dtype,
    kv_heads: int,
    head: int,
    block: int,
    device: Any,
) -> str:
    """Our ROCm-layout cache against ROCM_ATTN's own: the backend's KV cache (get_kv_cache_shape,
    [2, N, block, kv_heads, head] in 0.26.0) split as RocmAttentionImpl.forward splits it
    (PagedAttention.split_kv_cache)."""
    from kernels_check.paging import alloc_rocm

    kv = vllm_kv_cache(backend, 3, block, kv_heads, head, dtype, device)
    theirs = split(kv, kv_heads, head)
    mine = alloc_rocm(3, block, kv_heads, head, dtype, device)
    return check_layout(mine, theirs, f"{backend.__name__} shape {tuple(kv.shape)} split by {split.__qualname__}")


def fa_layout(backend: Any, dtype: torch.dtype, kv_heads: int, head: int, block: int, device: Any) -> str:
    """Our FLASH_ATTN-layout cache against the backend's: its KV cache split as FlashAttentionImpl.forward
    does (transpose(1, 2), then K and V halves of the last dim)."""
    from kernels_check.paging import alloc_fa

    kv = vllm_kv_cache(backend, 3, block, kv_heads, head, dtype, device)
    theirs = tuple(kv.transpose(1, 2).split(head, dim=-1))
    mine = alloc_fa(3, block, kv_heads, head, dtype, device)
    order = backend.get_kv_cache_stride_order()
    return check_layout(mine, theirs, f"{backend.__name__} shape {tuple(kv.shape)} stride order {tuple(order)}")


def _not_checked(exc: BaseException) -> str:
    first = str(exc).splitlines()[0] if str(exc) else ""
    return f"not checked: {type(exc).__name__}: {first}"[:300]


def _rocm_check(dtype: torch.dtype, kv_heads: int, head_size: int, block_size: int, device: torch.device) -> str:
    from vllm.v1.attention.backends.rocm_attn import RocmAttentionBackend
    from vllm.v1.attention.ops.paged_attn import PagedAttention

    return rocm_layout(
        RocmAttentionBackend, PagedAttention.split_kv_cache, dtype, kv_heads, head_size, block_size, device
    )


def _fa_check(dtype: torch.dtype, kv_heads: int, head_size: int, block_size: int, device: torch.device) -> str:
    from vllm.v1.attention.backends.flash_attn import FlashAttentionBackend

    if not hasattr(FlashAttentionBackend, "get_kv_cache_shape"):  # before the config, which takes seconds
        raise AttributeError("FlashAttentionBackend.get_kv_cache_shape does not exist in this vLLM")
    with vllm_config_context():  # the stride order reads the current config
        return fa_layout(FlashAttentionBackend, dtype, kv_heads, head_size, block_size, device)


def layout_check(
    dtype: torch.dtype, kv_heads: int, head_size: int, block_size: int, device: torch.device
) -> dict[str, str]:
    """Do our cache views address the cache as vLLM's backends do? Read against vLLM 0.26.0's backend
    API (get_kv_cache_shape / get_kv_cache_stride_order), FlashAttention's inside vLLM's config
    context; a release without that API (0.32.0 builds layouts from kv_cache_interface.KVCacheLayout)
    says "not checked" and why, as does any other failure: never a stop."""
    res = {}
    for name, check in (("rocm", _rocm_check), ("fa", _fa_check)):
        try:
            res[name] = check(dtype, kv_heads, head_size, block_size, device)
        except Exception as exc:
            res[name] = _not_checked(exc)
    return res
