"""The memory READ bandwidth a GPU actually achieves, measured once per run in a few seconds.

The roofline's datasheet figure (H200: 4.8 TB/s) is a peak no kernel reaches; this gives the
floor against what a streaming read does reach. Method: torch.sum over one contiguous float32
buffer (sized to free memory, default at most 4 GiB, far beyond L2), a few warm-up sums, then
timed sums enqueued back to back with a CUDA event between each (the GPU never idles waiting for
the CPU); bandwidth = buffer bytes / one sum's time, in GB/s (1e9, as datasheets count), best and
median. A sum reads every byte once and writes 4, so it is a read figure; a copy would count read
plus write.

It runs in a child process of the given interpreter (the arm's python has torch and CUDA; the
harness may have neither) and prints one JSON line. device="cpu" runs the same script on the CPU
(wall clock instead of events) so the subprocess and JSON plumbing are tested for real on a
machine without a GPU; the GPU figure itself is only proven on a GPU. No server may hold the GPU
while it runs, or the figure is shared bandwidth.

Never raises: no CUDA, a missing interpreter or torch, a crash, a timeout or unreadable output
give {"available": False, "reason": "..."}.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
from collections.abc import Mapping
from typing import Any

CHILD = r"""
import json, statistics, sys, time
a = json.loads(sys.argv[1])
import torch
dev = torch.device(a["device"])
cuda = dev.type == "cuda"
if cuda and not torch.cuda.is_available():
    print(json.dumps({"available": False, "reason": f"no CUDA device visible to torch {torch.__version__} ({sys.executable})"}))
    sys.exit(0)
if cuda:
    if dev.index is None:  # torch.cuda.mem_get_info refuses a bare "cuda" (seen on the H200)
        dev = torch.device("cuda", 0)
    torch.cuda.set_device(dev)
    free, _ = torch.cuda.mem_get_info(dev)
    nbytes = min(a["max_bytes"], int(free * a["free_fraction"]))
    name = torch.cuda.get_device_name(dev)
    if nbytes < 1 << 28:  # a buffer near L2's size would time the cache, not HBM
        print(json.dumps({"available": False, "reason": f"only {free / 2**30:.2f} GiB free on {name}"}))
        sys.exit(0)
else:
    nbytes, name = a["max_bytes"], "cpu"
x = torch.ones(nbytes // 4, dtype=torch.float32, device=dev)
nbytes = x.numel() * 4
for _ in range(a["warmup"]):
    torch.sum(x)
if cuda:
    ev = [torch.cuda.Event(enable_timing=True) for _ in range(a["iters"] + 1)]
    torch.cuda.synchronize()
    ev[0].record()
    for i in range(a["iters"]):
        torch.sum(x)
        ev[i + 1].record()
    torch.cuda.synchronize()
    secs = [ev[i].elapsed_time(ev[i + 1]) / 1e3 for i in range(a["iters"])]
    method = "torch.sum over a contiguous float32 buffer; CUDA events between back-to-back sums"
else:
    secs = []
    for _ in range(a["iters"]):
        t = time.perf_counter()
        torch.sum(x)
        secs.append(time.perf_counter() - t)
    method = "torch.sum over a contiguous float32 buffer; wall clock per sum (CPU)"
print(json.dumps({"available": True, "method": method, "device": str(dev), "device_name": name,
                  "torch_version": torch.__version__, "bytes": nbytes, "warmup": a["warmup"],
                  "iterations": a["iters"], "best_gbps": nbytes / min(secs) / 1e9,
                  "median_gbps": nbytes / statistics.median(secs) / 1e9,
                  "times_ms": [round(s * 1e3, 4) for s in secs]}))
"""


def _unavailable(reason: str) -> dict[str, Any]:
    return {"available": False, "reason": reason}


def measure(
    python: str,
    device: str = "cuda",
    *,
    max_bytes: int = 4 << 30,
    free_fraction: float = 0.5,
    warmup: int = 5,
    iters: int = 30,
    timeout_s: float = 180.0,
    env: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """Achieved read bandwidth of `device` as seen by interpreter `python` (a JSON-ready dict).

    Available: method, device, device_name, torch_version, bytes (the buffer), warmup, iterations,
    best_gbps, median_gbps, times_ms (one per timed sum). Else: available False and a reason."""
    if device == "cuda":
        device = "cuda:0"  # torch.cuda.mem_get_info wants an index (the H200 run of 2026-12-01 failed on "cuda")
    args = {
        "device": device,
        "max_bytes": int(max_bytes),
        "free_fraction": float(free_fraction),
        "warmup": int(warmup),
        "iters": max(1, int(iters)),
    }
    try:
        p = subprocess.run(
            [python, "-c", CHILD, json.dumps(args)],
            capture_output=True,
            text=True,
            errors="replace",
            timeout=timeout_s,
            env=dict(env if env is not None else os.environ),
        )
    except subprocess.TimeoutExpired:
        return _unavailable(f"bandwidth probe timed out after {timeout_s:g} s")
    except OSError as exc:
        return _unavailable(f"cannot run {python}: {exc}")
    if p.returncode != 0:
        last = (p.stderr.strip().splitlines() or ["no stderr"])[-1]
        return _unavailable(f"bandwidth probe exited {p.returncode}: {last[:300]}")
    lines = p.stdout.strip().splitlines()
    try:
        out = json.loads(lines[-1])
    except (IndexError, json.JSONDecodeError):
        return _unavailable(f"bandwidth probe printed no JSON result: {p.stdout.strip()[-200:]!r}")
    if not isinstance(out, dict) or "available" not in out:
        return _unavailable(f"bandwidth probe printed an unexpected result: {lines[-1][:200]!r}")
    return out


def measured_gbps(result: Mapping[str, Any] | None) -> float | None:
    """The figure a floor should use: the best sum (the bandwidth the GPU can reach), or None."""
    if not result or not result.get("available"):
        return None
    bw = result.get("best_gbps")
    return float(bw) if isinstance(bw, (int, float)) and math.isfinite(bw) and bw > 0 else None
