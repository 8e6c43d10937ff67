"""Per-process routing recorder: which attention path each layer class took, counted in-process.

What is counted (a dict increment per call; nothing is synchronised with the device):
  forward:<ImplClass>         the attention implementation's forward, per layer class (any backend:
                              FlashAttentionImpl, TritonAttentionImpl, RocmAttentionImpl,
                              CPUAttentionBackendImpl, ...), hooked on the class of every layer's impl
  rocm_custom_op              vllm._custom_ops.paged_attention_rocm (the custom ROCm kernel)
  triton_paged_attention_2d   launches of kernel_paged_attention_2d in chunked_prefill_paged_decode
  gate                        use_rocm_custom_paged_attention's answer with its arguments
  patched_calls               per function a patch changes: its calls, and for the gate the answers
                              unlike vLLM's own (the entry asks both), so an inert arm is caught
Kernel counts are keyed by the layer class whose forward was running, and by the kernel's own
arguments (head size, block size, heads, window, dtypes). A layer class is the layer geometry plus
the implementation: head size, q/kv heads, sliding window, dtypes, block size.

CUDA graphs: a replayed graph runs no Python, so under FULL / FULL_AND_PIECEWISE graphs the counts
come from graph capture and eager steps only. With --enforce-eager or cudagraph_mode PIECEWISE the
attention runs eagerly on every step and the counts are per step; the record says which applied.

The record is JSON, written atomically (tmp file + os.replace) every E2E_FLUSH_S seconds by a daemon
thread and at exit, so a killed worker still leaves its counts. Where the counters attach inside
vLLM is e2e/plugin/instrument.py's.
"""

from __future__ import annotations

import atexit
import json
import multiprocessing
import multiprocessing.util
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

from e2e.plugin import hooks, targets
from e2e.plugin.contract import GATE_FUNCTION, GATES, RECORD_SCHEMA

SCHEMA = RECORD_SCHEMA
MAX_STEPS = 20000  # per-step mode keeps at most this many steps with attention calls
NO_LAYER = "-"  # kernel called outside any hooked attention forward

GRAPH_NOTE_FULL = (
    "CUDA graphs with FULL capture are on: replayed steps run no Python, so these "
    "counts come from graph capture and eager steps, not from every step"
)
GRAPH_NOTE_EAGER = "attention ran eagerly on every step (no full CUDA graphs): counts are per step"
# The gate's arguments as counted: its answers are keyed by (layer class, qtype, head_size,
# block_size, gqa_ratio, sliding_window, kv_cache_dtype, alibi is None, sinks is None, answer).
GateKey = tuple[str, str | None, Any, Any, Any, Any, Any, bool, bool, bool]
GATE_ARGS = (
    "qtype",
    "head_size",
    "block_size",
    "gqa_ratio",
    "max_seq_len",
    "sliding_window",
    "kv_cache_dtype",
    "alibi_slopes",
    "sinks",
)


def process_role() -> tuple[str, int | None]:
    """(role, local rank if named) from the process name vLLM gives its processes."""
    name = multiprocessing.current_process().name
    if name.startswith("VllmWorker"):
        tail = name.rsplit("-", 1)[-1]
        return "Worker", int(tail) if tail.isdigit() else None
    if name.startswith("EngineCore"):
        return "EngineCore", None
    if name.startswith("ApiServer") or name.startswith("APIServer"):
        return "APIServer", None
    if name == "MainProcess":
        argv = " ".join(sys.argv[:3])
        if "api_server" in argv or "serve" in argv or "cli.main" in argv or "cli/main" in argv:
            return "APIServer", None
        return "Helper", None
    return name, None


def _dtype(x: Any) -> str | None:
    if x is None:
        return None
    return str(x).removeprefix("torch.")


def _hashable(x: Any) -> Any:
    """A list argument as a tuple: the gate's arguments are a dict key."""
    return tuple(x) if isinstance(x, list) else x


def _window(sw: Any) -> Any:
    if sw is None or sw == 0 or sw == (-1, -1) or sw == -1:
        return None
    return list(sw) if isinstance(sw, tuple) else sw


class Recorder:
    def __init__(self, record_dir: Path | None, arm: str, mode: str = "aggregate", flush_s: float = 1.0) -> None:
        self.record_dir = Path(record_dir) if record_dir else None
        self.arm = arm
        self.mode = mode
        self.per_step = mode == "per-step"
        self.flush_s = flush_s
        self.hooked: dict[str, str] = {}  # what got hooked here, and how
        self.missing: dict[str, str] = {}  # target -> why it was not hooked
        self.extra: dict[str, Any] = {}  # filled by the plugin (patches, ...)
        self._flushing = False
        self._new_process()
        # With VLLM_WORKER_MULTIPROC_METHOD=fork vLLM forks its engine core (and workers) from this
        # process: the child inherits this object, its hooks and patches, but is another process
        # with its own counts, record file and flush thread (threads do not survive a fork).
        multiprocessing.util.register_after_fork(self, Recorder._after_fork)

    def _new_process(self) -> None:
        """This process's identity and counts, empty (at start, and in a forked child)."""
        self.role, self.rank = process_role()
        self.pid = os.getpid()
        self.started = time.time()
        self.counts: dict[tuple[str, str, str], int] = {}  # (layer class, path, kernel args) -> n
        self.gate: dict[GateKey, list[Any]] = {}  # -> [n, min max_seq_len, max max_seq_len]
        # patched function ("module:qualname") -> [calls, answers unlike vLLM's own (gates only)]
        self.patched: dict[str, list[int]] = {t: [0, 0] for t in self.extra.get("patch_targets", ())}
        self.layers: dict[str, dict[str, Any]] = {}  # layer class -> geometry + layer names
        self.layer_keys: dict[int, str] = {}  # id(Attention layer) -> layer class
        self.current = NO_LAYER  # layer class whose forward is running
        self.steps: list[tuple[int, dict[str, int]]] = []  # (step, counts) of steps with calls
        self.step_counts: dict[str, int] = {}
        self.n_steps = 0
        self.steps_dropped = 0
        self.info: dict[str, Any] = {}  # graph mode, ranks, block size, ...
        self._cache_config: Any = None
        self._seq = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()

    def _after_fork(self) -> None:
        """Run by multiprocessing in a child it forked, once the child has its Process name (so the
        role is right) and before its target runs. Hooks, patches and `extra` carry over: they are
        the same modules. The final write goes through multiprocessing's finalizers, since a forked
        child leaves by os._exit and never runs atexit."""
        self._new_process()
        self.extra["forked_from"] = os.getppid()
        if self._flushing:  # the parent's flush thread did not come along
            self.start_flushing()
            multiprocessing.util.Finalize(None, self._at_exit, exitpriority=100)
        try:
            self.write()
        except Exception as exc:  # never take vLLM down for a record
            self.info["flush_error"] = repr(exc)

    # -- counting (hot path: keep to dict operations) -------------------------------------------
    def count(self, path: str, args: str = "") -> None:
        key = (self.current, path, args)
        self.counts[key] = self.counts.get(key, 0) + 1
        if self.per_step:
            sk = f"{self.current}|{path}"
            self.step_counts[sk] = self.step_counts.get(sk, 0) + 1

    def watch(self, target: str) -> None:
        """Count the calls of a patched function (e2e/rundir/patch_evidence.py reads them)."""
        self.patched.setdefault(target, [0, 0])
        listed = self.extra.setdefault("patch_targets", [])
        if target not in listed:
            listed.append(target)

    def patched_call(self, target: str, differs: bool = False) -> None:
        v = self.patched.get(target)
        if v is not None:
            v[0] += 1
            v[1] += differs

    def gate_call(
        self, args: tuple[Any, ...], kwargs: dict[str, Any], answer: bool, original: bool | None = None
    ) -> None:
        self.patched_call(GATE_FUNCTION, original is not None and bool(original) != bool(answer))
        a = list(args) + [None] * (len(GATE_ARGS) - len(args))
        for i, n in enumerate(GATE_ARGS):
            if n in kwargs:
                a[i] = kwargs[n]
        max_seq = a[4]
        h = _hashable
        key: GateKey = (
            self.current,
            _dtype(a[0]),
            h(a[1]),
            h(a[2]),
            h(a[3]),
            h(a[5]),
            h(a[6]),
            a[7] is None,
            a[8] is None,
            bool(answer),
        )
        v = self.gate.get(key)
        if v is None:
            self.gate[key] = [1, max_seq, max_seq]
        else:
            v[0] += 1
            if max_seq is not None:
                v[1] = max_seq if v[1] is None else min(v[1], max_seq)
                v[2] = max_seq if v[2] is None else max(v[2], max_seq)
        if self.per_step:
            sk = f"{self.current}|gate:{bool(answer)}"
            self.step_counts[sk] = self.step_counts.get(sk, 0) + 1

    def end_step(self) -> None:
        self.n_steps += 1
        if self.per_step and self.step_counts:
            if len(self.steps) < MAX_STEPS:
                self.steps.append((self.n_steps, self.step_counts))
            else:
                self.steps_dropped += 1
            self.step_counts = {}

    # -- layer census ---------------------------------------------------------------------------
    def layer_class(self, layer: Any, impl: Any, kv_cache: Any) -> str:
        """The layer class of an Attention layer, computed once per layer (first forward)."""
        key = self.layer_keys.get(id(layer))
        if key is not None:
            return key
        g = {
            "impl": type(impl).__name__,
            "backend": _backend_name(layer),
            "head_size": getattr(layer, "head_size", None),
            "num_heads": getattr(layer, "num_heads", None),
            "num_kv_heads": getattr(layer, "num_kv_heads", None),
            "sliding_window": _window(getattr(layer, "sliding_window", None)),
            "dtype": _dtype(getattr(layer, "dtype", None)),
            "kv_cache_dtype": getattr(layer, "kv_cache_dtype", None),
            "block_size": getattr(self._cache_config, "block_size", None),
        }
        shape = list(getattr(kv_cache, "shape", []) or [])
        key = (
            f"{g['impl']} h{g['head_size']} q{g['num_heads']}/kv{g['num_kv_heads']} "
            f"sw{g['sliding_window'] or '-'} bs{g['block_size']} {g['dtype']} kv:{g['kv_cache_dtype']}"
        )
        entry = self.layers.setdefault(key, {"geometry": g, "kv_cache_shape": shape, "layers": []})
        name = getattr(layer, "layer_name", None) or f"id{id(layer)}"
        if name not in entry["layers"]:
            entry["layers"].append(name)
        # Profiling runs come before the KV cache exists (and before the final block size):
        # remember the class only once a real cache is there.
        if _numel(kv_cache) > 0:
            entry["kv_cache_shape"] = shape
            self.layer_keys[id(layer)] = key
        return key

    def note_layer_built(self, layer: Any) -> None:
        """Attention.__init__ ran: the model is built in this process; read its config once."""
        self.info.setdefault("layers_built", 0)
        self.info["layers_built"] += 1
        if self._cache_config is not None:
            return
        try:
            from vllm.config import get_current_vllm_config

            c = get_current_vllm_config()
            self._cache_config = c.cache_config
            cc = c.compilation_config
            mode = getattr(cc, "cudagraph_mode", None)
            self.info["cudagraph_mode"] = getattr(mode, "name", None) or (str(mode) if mode is not None else None)
            self.info["enforce_eager"] = bool(getattr(c.model_config, "enforce_eager", False))
            self.info["compilation_mode"] = str(getattr(cc, "mode", getattr(cc, "level", None)))
        except Exception as exc:  # the record says what could not be read
            self.info["config_error"] = repr(exc)
        try:
            from vllm.distributed import parallel_state as ps

            self.info["tp_rank"] = ps.get_tensor_model_parallel_rank()
            self.info["tp_size"] = ps.get_tensor_model_parallel_world_size()
            self.info["pp_rank"] = ps.get_pp_group().rank_in_group
            self.info["pp_size"] = ps.get_pp_group().world_size
        except Exception as exc:
            self.info["rank_error"] = repr(exc)

    # -- the record -----------------------------------------------------------------------------
    def graph_note(self) -> str | None:
        mode = self.info.get("cudagraph_mode")
        if mode is None:
            return None
        if self.info.get("enforce_eager") or "FULL" not in str(mode):
            return GRAPH_NOTE_EAGER
        return GRAPH_NOTE_FULL

    def snapshot(self, final: bool = False) -> dict[str, Any]:
        from e2e.plugin import patches

        counts = dict(self.counts)
        gate = dict(self.gate)
        self._seq += 1
        rec = {
            "schema": SCHEMA,
            "arm": self.arm,
            "role": self.role,
            "rank": self.info.get("tp_rank", self.rank),
            "local_rank": self.rank,
            "pid": self.pid,
            "process_name": multiprocessing.current_process().name,
            "argv": sys.argv[:4],
            "python": sys.version.split()[0],
            "executable": sys.executable,
            "routing_mode": self.mode,
            "runs_model": bool(self.layers or self.info.get("layers_built") or self.n_steps),
            **self.info,
            "counts_note": self.graph_note(),
            **self.extra,
            "gate": patches.gate_state(),
            "hooked": dict(self.hooked),
            "pending_hooks": hooks.pending(),
            "hook_status": targets.status(dict(self.hooked), dict(self.missing)),
            "runner_modules": targets.model_runner_modules(),
            "serves_model": self.role == "Worker" or bool(targets.model_runner_modules()),
            "model_steps": self.n_steps,
            "layers": {k: {**v, "layers": list(v["layers"])} for k, v in dict(self.layers).items()},
            "counts": [
                {"layer_class": k[0], "path": k[1], "kernel_args": k[2], "n": n} for k, n in sorted(counts.items())
            ],
            # only the functions watched here: a record without one says nothing about it
            "patched_calls": {
                t: {"calls": v[0], "differing": v[1] if t in GATES else None} for t, v in dict(self.patched).items()
            },
            "gate_calls": [_gate_call(k, v) for k, v in gate.items()],
            "started_unix": self.started,
            "written_unix": time.time(),
            "seq": self._seq,
            "final": final,
            "flush_s": self.flush_s,
        }
        if self.per_step:
            rec["steps"] = [[s, dict(c)] for s, c in list(self.steps)]
            rec["steps_dropped"] = self.steps_dropped
        return rec

    def write(self, final: bool = False) -> Path | None:
        if self.record_dir is None:
            return None
        with self._lock:
            rec = self.snapshot(final)
            self.record_dir.mkdir(parents=True, exist_ok=True)
            path = self.record_dir / f"{self.role}-{self.pid}.json"
            tmp = path.with_name(f".{path.name}.tmp")
            with open(tmp, "w") as f:
                json.dump(rec, f, default=str)
            os.replace(tmp, path)
            return path

    def start_flushing(self) -> None:
        self._flushing = True

        def loop() -> None:
            while not self._stop.wait(self.flush_s):
                try:
                    self.write()
                except Exception as exc:  # never take vLLM down for a record; say so once
                    self.info["flush_error"] = repr(exc)

        threading.Thread(target=loop, name="e2e-routing-flush", daemon=True).start()
        atexit.register(self._at_exit)

    def _at_exit(self) -> None:
        self._stop.set()
        try:
            self.write(final=True)
        except Exception:
            pass

    def note_missing(self, target: str, why: str) -> None:
        """A hook found its module but not what it wraps (e2e/plugin/targets.py's "missing")."""
        if target not in self.hooked:
            prev = self.missing.get(target)
            self.missing[target] = why if prev is None or why in prev else f"{prev}; {why}"


def _numel(t: Any) -> int:
    try:
        return int(t.numel())
    except Exception:
        return 0


def _backend_name(layer: Any) -> str | None:
    b = getattr(layer, "attn_backend", None)
    try:
        return b.get_name() if b is not None else None
    except Exception:
        return getattr(b, "__name__", None)


def _gate_call(k: GateKey, v: list[Any]) -> dict[str, Any]:
    """One distinct call of the gate as the record writes it: its arguments, its answer, how often
    it was asked and the max_seq_len it saw."""
    return {
        "layer_class": k[0],
        "qtype": k[1],
        "head_size": k[2],
        "block_size": k[3],
        "gqa_ratio": k[4],
        "sliding_window": list(k[5]) if isinstance(k[5], tuple) else k[5],
        "kv_cache_dtype": k[6],
        "alibi_none": k[7],
        "sinks_none": k[8],
        "answer": k[9],
        "n": v[0],
        "max_seq_len_min": v[1],
        "max_seq_len_max": v[2],
    }
