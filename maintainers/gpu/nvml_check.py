"""Issue 23 on a real GPU, without vLLM: do e2e/gpu/gpu_state.py's readings and its exclusivity policy see
what they claim on this machine's NVML? (The tests script a fake NVML; this asks the real one.)

    python3 maintainers/gpu/nvml_check.py OUT_DIR [SECONDS]

A stand-in "server" (a torch process in its own session, like the harness's servers, copying 2 GiB
buffers back to back) is started and watched through gpu_state.ServerWatch exactly as the runner
watches a server: pre-start, ready, rounds. Then a second torch process, outside that session, starts
on the same GPU: the `retry` policy must raise Contaminated and the `warn` policy must mark the cell.
Every reading goes to OUT_DIR/samples.jsonl; OUT_DIR/nvml-check.json holds the verdict of each step.
Exit status 0 only when every step saw what it should. No vLLM, no model: seconds of GPU time.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from e2e.gpu import gpu_state  # noqa: E402

BUSY = r"""
import os, sys, time, torch
a = torch.empty(2 << 30, dtype=torch.uint8, device="cuda"); b = torch.empty_like(a)
print(f"{sys.argv[1]} pid {os.getpid()} sid {os.getsid(0)} on {torch.cuda.get_device_name()}", flush=True)
t0 = time.time()
while time.time() - t0 < float(sys.argv[2]):
    for _ in range(20):
        b.copy_(a)
    torch.cuda.synchronize()
"""


def busy(name: str, seconds: float, own_session: bool, env: dict[str, str]) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", BUSY, name, str(seconds)],
        env=env,
        start_new_session=own_session,
        stdout=subprocess.PIPE,
        text=True,
    )


def wait_on_gpu(probe: gpu_state.GpuProbe, pid: int, timeout: float = 90.0) -> dict | None:
    """The first reading that lists pid among the GPU's compute processes, or None."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        s = probe.sample("wait")
        if any(p["pid"] == pid for g in s.get("gpus") or [] for p in g.get("processes") or []):
            return s
        time.sleep(0.5)
    return None


def main() -> int:
    out = Path(sys.argv[1])
    seconds = float(sys.argv[2]) if len(sys.argv) > 2 else 40.0
    out.mkdir(parents=True, exist_ok=True)
    samples = out / "samples.jsonl"
    checks: list[dict] = []

    def check(what: str, ok: bool, **seen) -> None:
        checks.append({"check": what, "ok": bool(ok), **seen})
        print(("ok   " if ok else "FAIL ") + what, json.dumps(seen, default=str)[:400], flush=True)

    notes: list[str] = []
    probe = gpu_state.GpuProbe.open(os.environ, 1)
    check("the probe opens", probe.available, source=getattr(probe.backend, "source", None), reason=probe.reason)
    if not probe.available:
        (out / "nvml-check.json").write_text(json.dumps({"checks": checks}, indent=1))
        return 1
    watch = gpu_state.ServerWatch(probe, "retry", notes.append, wait_s=5)
    watch.before_start("p1-d1024-standin", "0-check", samples)
    check("pre-start: an idle GPU holds no foreign process", not watch.pre_start, pre_start=watch.pre_start)

    sid = "standin-0"
    server = busy("server", seconds, True, {**os.environ, "E2E_SERVER_ID": sid})
    first = wait_on_gpu(probe, server.pid)
    check(
        "NVML lists the stand-in server's pid (same pid namespace)",
        first is not None,
        listed=[p for g in (first or {}).get("gpus", []) for p in g.get("processes") or []],
    )
    watch.started(server.pid, sid)
    watch.begin_cell("p1-d1024-standin")
    watch.checkpoint("ready")
    watch.checkpoint("warm")
    for r in range(3):
        time.sleep(2.0)  # a "round": the stand-in copies meanwhile
        watch.checkpoint(f"round {r}")
    st = watch.cell_state(first_cell=True)
    check(
        "the server's own process is own, not foreign",
        st["own_seen"] is True and not st["contaminated"],
        own_seen=st["own_seen"],
        foreign=st["foreign"],
    )
    check(
        "clocks, power and temperature are read",
        all(st[k] for k in ("sm_mhz", "mem_mhz", "power_w", "temp_c")),
        **{k: st[k] for k in ("sm_mhz", "mem_mhz", "power_w", "temp_c", "round_power_w")},
    )
    last = watch.samples[-1]["gpus"][0]
    check(
        "energy and violation counters are read",
        last.get("energy_j") is not None,
        energy_j=last.get("energy_j"),
        power_violation_ns=last.get("power_violation_ns"),
        thermal_violation_ns=last.get("thermal_violation_ns"),
        reasons=gpu_state.reason_names(last.get("reasons")),
    )

    neighbour = busy("neighbour", seconds, False, dict(os.environ))
    seen = wait_on_gpu(probe, neighbour.pid)
    check("NVML lists the neighbour's pid", seen is not None)
    try:
        watch.checkpoint("round 3")
        check("retry: a neighbour mid-cell voids the attempt (Contaminated)", False)
    except gpu_state.Contaminated as exc:
        check(
            "retry: a neighbour mid-cell voids the attempt (Contaminated)",
            True,
            error=str(exc),
            recorded=watch.contaminated_attempts,
        )
    warn = gpu_state.ServerWatch(probe, "warn", notes.append)
    warn.path = samples
    warn.started(server.pid, sid)
    warn.begin_cell("p1-d1024-standin-warn")
    warn.checkpoint("round 0")
    ws = warn.cell_state(first_cell=False)
    check(
        "warn: the cell is counted and marked contaminated, naming the neighbour",
        ws["contaminated"] and any(p["pid"] == neighbour.pid for p in ws["foreign"]),
        foreign=ws["foreign"],
    )
    after = gpu_state.ServerWatch(probe, "warn", notes.append)
    after.before_start("p2-d1024-standin", "1-check", samples)
    check(
        "pre-start: a GPU held by the neighbour is reported before a start",
        any(p["pid"] == neighbour.pid for p in after.pre_start),
        pre_start=after.pre_start,
    )

    for p in (server, neighbour):
        p.terminate()
        try:
            print(p.communicate(timeout=30)[0].strip(), flush=True)
        except subprocess.TimeoutExpired:
            p.kill()
    probe.close()
    ok = all(c["ok"] for c in checks)
    (out / "nvml-check.json").write_text(
        json.dumps(
            {"ok": ok, "checks": checks, "notes": notes, "cell_state": st, "warn_cell_state": ws}, indent=1, default=str
        )
    )
    print("all checks ok" if ok else "some checks FAILED", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
