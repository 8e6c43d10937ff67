"""The state of a server's GPUs around its cells, and the exclusivity policy (--gpu-exclusive).

A foreign process on a cell's GPU moves the cell by more than the minimum effect (issue 23, one H200:
a second vLLM server moved decode -2.4 %, a neighbour decoding back to back more than doubled it),
and nothing else in a run folder would show it. So every server's GPUs are sampled at fixed points,
never inside a timed request (the schedule is a contract: tests script the fake NVML by it):

    pre-start   before the server starts (a GPU already in use is reported before anything is measured)
    ready       the server answers, before its first cell's warm-up
    warm        after a cell's warm-up, before its first timed round
    round R     after timed round R (R from 0)
    bookend R   after closing round R (e2e/stats/bookends.py)

A sample holds, per GPU: its compute processes (each own = in the server's session, or foreign), SM
and memory clocks, power, temperature, the clock-event ("throttle") reasons, and NVML's cumulative
power/thermal violation times and energy (an AMD GPU's: e2e/gpu/gpu_amd.py, a throttle status for
the reasons, violation accumulators on MI300+ only). A run whose GPUs cannot be read at all says so
before its first server (preflight; `fail` refuses to start). The cumulative counters are why no background sampler
runs: their difference across a round is what happened during its requests, whatever the GPU did
between two samples, and with no thread the timed region costs nothing extra by construction.

The readings themselves (NVML, else nvidia-smi; own or foreign) are e2e/gpu/gpu_probe.py's.

Policy, for a foreign process seen from `ready` on (ServerWatch.checkpoint):
    retry (default)  the attempt is void (Contaminated, a ServerGone: e2e/serve/attempts.py measures the cell
                     again on a fresh server within run.retries); its request rows stay, never counted
    warn             counted, and the cell row says `contaminated` (the report lists it)
    fail             the run stops (GpuExclusiveStop); --resume measures the cell again
Before a server starts (ServerWatch.before_start) a foreign process is reported at once; `fail` stops
there, `retry` waits up to wait_s for the GPU to clear and then stops with GpuBusy (the Ray executor
moves the group to another slot instead), `warn` goes on.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from e2e.errors import UserError
from e2e.gpu.gpu_probe import REASONS, THROTTLE, foreign
from e2e.gpu.gpu_probe import GpuProbe as GpuProbe
from e2e.gpu.gpu_probe import reason_names as reason_names
from e2e.rundir.gpu_rows import VOIDED as VOIDED
from e2e.rundir.gpu_rows import cell_summary as cell_summary
from e2e.rundir.gpu_rows import describe as describe
from e2e.rundir.gpu_rows import samples_file as samples_file
from e2e.rundir.store import voided
from e2e.safety.safe_io import open_append, write_atomic
from e2e.serve.server import ServerGone

# The "x as x" imports are re-exports: the runner, the tests and the GPU machines' NVML check script read them here.

POLICIES = ("retry", "warn", "fail")
PRESTART_WAIT_S = 120.0  # retry: how long a GPU held before a start may take to clear
POLL_S = 5.0


class Contaminated(ServerGone):
    """retry: a foreign process on the GPU voids the attempt; the cell is measured again."""


class GpuBusy(UserError):
    """retry: the GPU still holds a foreign process before a server starts (after waiting)."""


class GpuExclusiveStop(UserError):
    """fail: a foreign process on a cell's GPU stops the run."""


def preflight(probe: GpuProbe, policy: str, note: Callable[[str], None]) -> None:
    """Before the run's first server: a GPU state that cannot be read is said at once, naming what was
    tried (the policies act only on readings, so `retry` and `fail` would otherwise be silently
    blind); `fail` refuses to start. A GPU that does not report some readings (NOT_SUPPORTED) is
    said too. The probe is the first server group's own (no extra open: the schedule stays as it is)."""
    if not probe.available:
        if policy == "warn":
            return
        text = (
            f"GPU state cannot be read ({probe.reason}): --gpu-exclusive {policy} cannot see another process on the GPU"
        )
        if policy == "fail":
            probe.close()
            raise UserError(f"{text}; refusing to start (--gpu-exclusive warn runs without it)")
        note(f"warning: {text}; every cell counts as measured, and the report says so")
        return
    said = probe.notice()
    if said:
        note(f"note: {said}")


# -- the policy over one server group's life ---------------------------------------------------------
class ServerWatch:
    """The GPU checks of a server group (a cell, or an arm-pass's depths), over its attempts.

    The runner calls before_start() before each server, started() once it answers, begin_cell()
    before each cell, checkpoint(label) at each point of the schedule, cell_state() for the row."""

    def __init__(self, probe: GpuProbe, policy: str, note: Callable[[str], None], wait_s: float = PRESTART_WAIT_S):
        if policy not in POLICIES:
            raise UserError(f"--gpu-exclusive {policy!r}: use one of {', '.join(POLICIES)}")
        self.probe, self.policy, self.note, self.wait_s = probe, policy, note, wait_s
        self.leader: int | None = None
        self.server_id: str | None = None
        self.path: Path | None = None
        self.attempt = ""
        self.pre_start: list[dict[str, Any]] = []
        self.contaminated_attempts: dict[str, list[dict[str, Any]]] = {}
        self.cell_id: str | None = None
        self._reset_cell()

    # -- per server --------------------------------------------------------------------------------
    def before_start(self, what: str, attempt: str, samples_path: Path) -> None:
        """The pre-start sample of a new server attempt; a foreign process is reported at once."""
        self.attempt, self.path, self.leader, self.server_id = attempt, samples_path, None, None
        self._reset_cell()  # what an earlier attempt saw is in contaminated_attempts, not this one's state
        s = self._sample("pre-start")
        held = foreign(s)
        self.pre_start = held
        if not held:
            return
        self.note(f"warning: before {what}'s server starts, its GPU holds another process: {describe(held)}")
        if self.policy == "fail":
            raise GpuExclusiveStop(
                f"{describe(held)} before {what}'s server starts (--gpu-exclusive fail): "
                f"nothing measured on it; --resume when the GPU is free"
            )
        if self.policy == "warn":
            return
        deadline = time.monotonic() + self.wait_s
        while held and time.monotonic() < deadline:
            time.sleep(min(POLL_S, max(0.0, deadline - time.monotonic())))
            held = foreign(self._sample("pre-start"))
        if held:
            raise GpuBusy(
                f"{describe(held)} still on the GPU after {self.wait_s:.0f} s, before {what}'s server "
                "starts (--gpu-exclusive retry): nothing measured on it; --resume when the GPU is free "
                "(or --gpu-exclusive warn to measure beside it)"
            )
        self.note(f"{what}: the GPU is free again; starting its server")

    def read_voided(self, server_dir: Path) -> None:
        """The attempts of this server group that an earlier harness voided (a run resumed after its
        harness stopped or died): each cell row names every voided attempt of its cell, not only this
        process's. Each record is checked as it is read (store.voided): a damaged one is one line."""
        for v in voided(server_dir):
            self._void(v)

    def _void(self, voided: dict[str, Any]) -> None:
        self.contaminated_attempts.setdefault(voided.get("cell_id") or "", []).append(
            {k: voided[k] for k in ("attempt", "at", "foreign")}
        )

    def started(self, leader: int, server_id: str) -> None:
        self.leader, self.server_id = leader, server_id

    # -- per cell ------------------------------------------------------------------------------------
    def _reset_cell(self) -> None:
        self.samples: list[dict[str, Any]] = []
        self.unreadable: str | None = None
        self.failed = 0  # readings of this cell that failed
        self.seen: dict[int, dict[str, Any]] = {}  # pid -> foreign process, with first_seen
        self.throttled: dict[int, set[str]] = {}  # round -> reasons
        self.round_power: list[float] = []  # mean W over a round, from the energy counter
        self.prev: dict[str, Any] | None = None
        self.in_bookend = False
        self.bookend_foreign: dict[int, dict[str, Any]] = {}

    def begin_cell(self, cell_id: str) -> None:
        self._reset_cell()
        self.cell_id = cell_id

    def begin_bookend(self) -> None:
        """Closing rounds: recorded for the bookend result, never voiding the cells already measured."""
        self.in_bookend = True

    def checkpoint(self, label: str) -> None:
        was_open = self.probe.available
        s = self._sample(label)
        if not s.get("available"):  # no GPU here, or a reading that failed: said in the row
            self.unreadable = s.get("reason")
            self.failed += was_open  # failed, where readings were possible: said in the report and here
            if was_open and self.failed == 1:
                self.note(
                    f"warning: {self.cell_id}: a GPU reading failed at '{label}' ({self.unreadable}): a "
                    "process on the GPU meanwhile is not seen, and the cell counts (the report names it)"
                )
            return
        self.samples.append(s)
        if label.startswith("round ") and self.prev is not None:
            why = _throttled(self.prev, s)
            if why:
                self.throttled[int(label.split()[1])] = why
            self.round_power += _mean_power(self.prev, s)
        self.prev = s
        held = foreign(s)
        if self.in_bookend:
            for p in held:
                self.bookend_foreign.setdefault(p["pid"], {**p, "first_seen": label})
            return
        new = [p for p in held if p["pid"] not in self.seen]
        for p in new:
            self.seen[p["pid"]] = {**p, "first_seen": label}
        if not held:
            return
        text = f"{describe(held)} on the GPU at '{label}'"
        if self.policy == "retry":
            voided = {"cell_id": self.cell_id, "attempt": self.attempt, "at": label, "foreign": held}
            if self.path is not None:  # on disk beside its readings: a resumed harness still names it
                write_atomic(self.path.parent / VOIDED, json.dumps(voided) + "\n")
            self._void(voided)
            raise Contaminated(f"GPU not exclusive: {text}")
        if self.policy == "fail":
            raise GpuExclusiveStop(
                f"{self.cell_id}: {text} (--gpu-exclusive fail): stopping; this attempt's rows "
                f"are kept, never counted; --resume measures {self.cell_id} again"
            )
        if new:
            self.note(
                f"warning: {self.cell_id}: {describe(new)} on the GPU at '{label}': "
                "counted anyway (--gpu-exclusive warn), the cell is marked contaminated"
            )

    def _sample(self, label: str) -> dict[str, Any]:
        s = self.probe.sample(label, self.leader, self.server_id)
        if self.path is not None and self.probe.available:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with open_append(self.path) as f:  # the evidence: every reading of this attempt
                f.write((json.dumps(s) + "\n").encode())
        return s

    def cell_state(self, first_cell: bool) -> dict[str, Any]:
        """The cell row's `gpu_state` (formats.GpuCellState). first_cell: the cell that paid the start
        carries the server's pre-start reading."""
        base: dict[str, Any] = {
            "available": self.probe.available,
            "policy": self.policy,
            "contaminated_attempts": self.contaminated_attempts.get(self.cell_id or "", []),
        }
        if self.failed:
            base["failed_readings"] = self.failed
        backend = self.probe.backend
        if backend is None:
            return {**base, "reason": self.probe.reason}
        gpus = self.samples
        first = gpus[0]["gpus"] if gpus else []
        if self.unreadable:
            base["reason"] = f"{'some readings' if gpus else 'every reading'} failed: {self.unreadable}"
        own = [p for s in gpus for g in s["gpus"] for p in g.get("processes") or [] if p.get("own")]
        listed = all(g.get("processes") is not None for s in gpus for g in s["gpus"])

        def span(key: str) -> list[float] | None:
            v = [g[key] for s in gpus for g in s["gpus"] if g.get(key) is not None]
            return [min(v), max(v)] if v else None

        return {
            **base,
            "source": backend.source,
            # bdf and arch: an AMD GPU's (gpu_amd.py), matched by bus id
            "gpus": [{k: g.get(k) for k in ("index", "uuid", "name", "bdf", "arch") if k in g} for g in first],
            "samples": len(gpus),
            "contaminated": bool(self.seen),
            "foreign": list(self.seen.values()),
            "pre_start_foreign": self.pre_start if first_cell else [],
            "own_seen": bool(own) if gpus and listed else None,
            "sm_mhz": span("sm_mhz"),
            "mem_mhz": span("mem_mhz"),
            "power_w": span("power_w"),
            "temp_c": span("temp_c"),
            "round_power_w": [min(self.round_power), max(self.round_power)] if self.round_power else None,
            "throttled_rounds": sorted(self.throttled),
            "throttle_reasons": sorted(set().union(*self.throttled.values())) if self.throttled else [],
        }

    def throttle_warning(self) -> str | None:
        if not self.throttled:
            return None
        why = sorted(set().union(*self.throttled.values()))
        return (
            f"warning: {self.cell_id}: GPU throttled ({', '.join(why)}) during timed round(s) "
            f"{', '.join(str(r) for r in sorted(self.throttled))}"
        )

    def close(self) -> None:
        self.probe.close()


def _throttled(before: dict[str, Any], after: dict[str, Any]) -> set[str]:
    """Why the round between two samples ran throttled: a power/thermal violation counter that grew (NVML
    and amdsmi on MI300+ count continuously), or a throttle reason / status at the closing sample."""
    why: set[str] = set()
    for b, a in zip(before["gpus"], after["gpus"]):
        why.update(n for bit, n in REASONS.items() if bit & THROTTLE & (a.get("reasons") or 0))
        if a.get("throttle"):  # amdsmi's throttle_status (AMD: no reason bits)
            why.add("throttle_status")
        for key, name in (
            ("power_violation_ns", "power_violation"),
            ("thermal_violation_ns", "thermal_violation"),
            ("power_violation_acc", "power_violation"),  # amdsmi's accumulators (MI300+): counts, not ns
            ("thermal_violation_acc", "thermal_violation"),
        ):
            if a.get(key) is not None and b.get(key) is not None and a[key] > b[key]:
                why.add(name)
    return why


def _mean_power(before: dict[str, Any], after: dict[str, Any]) -> list[float]:
    """Per GPU, the mean power over the round (energy counter difference / time): the reading under
    load, where a sample between rounds catches the GPU idle for a moment."""
    dt = after["t_unix"] - before["t_unix"]
    return [
        (a["energy_j"] - b["energy_j"]) / dt
        for b, a in zip(before["gpus"], after["gpus"])
        if dt > 0 and a.get("energy_j") is not None and b.get("energy_j") is not None
    ]
