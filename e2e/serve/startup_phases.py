"""Where one vLLM server start went, read from the server's own log (the harness writes one per cell).

A log holds one or more starts, each opened by the harness's `# argv: ...` line; the phases are
those of the LAST start. Two kinds of figures come out:

  * gaps between marker lines' timestamps (vLLM prints MM-DD HH:MM:SS, one-second resolution, no
    year: each gap is good to about +-1 s). In time order, they partition the logged start:
        api_to_engine_s       API server banner ("version X" / "non-default args") -> first engine-core line
        engine_to_worker_s    first engine-core line -> first worker line (process start, NCCL, ...)
        worker_to_init_end_s  first worker line -> "init engine (profile, create kv cache, ...) took"
        init_end_to_api_s     that line -> "Starting vLLM server on" (or the first route line)
        total_logged_s        banner -> API ready; the four above sum to it when all are found.
    Time before the banner (interpreter start, importing vLLM) is not in the log: the harness's
    startup_s minus total_logged_s is that plus the readiness poll.
  * vLLM's own durations, where it prints them (several workers: the largest, as the slowest one
    gates the start): weights_s ("Loading weights took"), model_load_s ("Model loading took .. and X
    seconds", includes weights), dynamo_s ("Dynamo bytecode transform time"), compile_s
    ("torch.compile took X s in total"), engine_compile_s (init engine's "(compilation: X s)"),
    graph_capture_s ("Graph capturing finished in N secs", whole seconds), engine_init_s (init
    engine's "took X s"), and after_capture_s (a gap: last "Graph capturing finished" line -> init
    engine end: warm-up after capture).
compile_cache: "hit" (only "Directly load ..." lines), "miss" (only newly compiled graphs), "partial"
(both in one start), None (no torch.compile lines, e.g. enforce-eager). compile_cache_dir: the first
"Using cache directory:" path. starts_in_log: how many `# argv:` lines (a retried start shows 2).
`found` lists, sorted, what was seen, so an absent phase is explicit rather than a silent zero:
markers banner, engine, worker, capture_end, init_end, api_ready; durations weights, model_load,
dynamo, compile, graph_capture; compile_cache_dir; compile_cache_hit / _miss / _partial.

Pure and tolerant: any text or bytes in (non-UTF-8 replaced, unknown lines skipped), never raises;
what cannot be read is None.
"""

from __future__ import annotations

import re
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

# Every key of the result, in report order (rows carry all of them, None where not found).
KEYS: tuple[str, ...] = (
    "vllm_version",
    "starts_in_log",
    "api_to_engine_s",
    "engine_to_worker_s",
    "worker_to_init_end_s",
    "init_end_to_api_s",
    "total_logged_s",
    "weights_s",
    "model_load_s",
    "dynamo_s",
    "compile_s",
    "engine_compile_s",
    "compile_cache",
    "compile_cache_dir",
    "graph_capture_s",
    "after_capture_s",
    "engine_init_s",
    "found",
)

_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
# "(Worker_TP0 pid=3759) INFO 11-29 19:09:01 [default_loader.py:430] Loading weights took 0.12 seconds";
# the process prefix is absent when vLLM runs in one process.
_LINE = re.compile(
    r"^\s*(?:\((?P<proc>[^()\s]*)\s+pid=\d+\)\s+)?"
    r"(?:DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL)\s+"
    r"(?P<mo>\d\d)-(?P<dd>\d\d) (?P<h>\d\d):(?P<mi>\d\d):(?P<s>\d\d)(?:\.\d+)?\s+"
    r"\[[^\]]*\]\s?(?P<msg>.*)$"
)
_PROC = re.compile(r"^\s*\((?P<proc>[^()\s]*)\s+pid=\d+\)")
_NUM = r"(\d+(?:\.\d+)?)"
_VERSION = re.compile(r"(?:^|\s)version\s+v?(\d+\.\d+[0-9A-Za-z.+\-]*)")
_ENGINE = re.compile(r"Initializing an? (?:V\d )?LLM engine(?: \(v(\d+\.\d+[0-9A-Za-z.+\-]*)\))?")

# vLLM's own duration lines: key -> pattern whose LAST group is the seconds.
_DURATIONS = {
    "weights_s": re.compile(r"Loading weights took " + _NUM + r" ?s"),
    "model_load_s": re.compile(r"Model loading took " + _NUM + r" ?G[iI]?B.*? and " + _NUM + r" ?s"),
    "dynamo_s": re.compile(r"Dynamo bytecode transform time: " + _NUM + r" ?s"),
    "compile_s": re.compile(r"torch\.compile (?:took|takes) " + _NUM + r" ?s in total"),
    "graph_capture_s": re.compile(r"Graph capturing finished in " + _NUM + r" ?sec"),
}
_INIT_END = re.compile(r"init engine \([^)]*\) took " + _NUM + r" ?s(?:econds)?(?: \(compilation: " + _NUM + r" ?s\))?")
_CACHE_DIR = re.compile(r"Using cache directory: (\S+)")
_HIT = ("Directly load the compiled graph", "Directly load AOT compilation")
_MISS = ("Compiling a graph for", "Cache the graph of")
_API_READY = ("Starting vLLM server on", "Application startup complete", "Route:", "Available routes are")


def _split_starts(text: str) -> list[list[str]]:
    starts: list[list[str]] = [[]]
    for line in re.split(r"\r\n|\r|\n", text):  # tqdm bars use \r: each redraw is its own line
        if line.startswith("# argv:"):
            starts.append([])
        starts[-1].append(line)
    return [s for s in starts if any(x.strip() for x in s)] or [[]]


class _Clock:
    """MM-DD HH:MM:SS -> datetime. The year is unknown: a date that falls well before the start's
    first one is taken to be in the next year (a run over New Year); leap year so 02-29 parses."""

    def __init__(self) -> None:
        self.first: datetime | None = None

    def at(self, m: re.Match[str]) -> datetime | None:
        try:
            f = [int(m.group(k)) for k in ("mo", "dd", "h", "mi", "s")]
            t = datetime(2000, f[0], f[1], f[2], f[3], f[4])
            if self.first is None:
                self.first = t
            elif t < self.first - timedelta(days=1):
                t = t.replace(year=2001)
        except ValueError:  # 13-45, 25:61:61, 02-29 of the next year ... (garbled): no timestamp
            return None
        return t


def _gap(a: datetime | None, b: datetime | None) -> float | None:
    """b - a in seconds; None when either is missing or they are out of order (then the markers are
    not the phase boundaries they stand for, e.g. a log whose first lines were lost)."""
    if a is None or b is None or b < a:
        return None
    return (b - a).total_seconds()


_MARKERS = ("banner", "engine", "worker", "capture_end", "init_end", "api_ready")


def parse(log: str | bytes | None) -> dict[str, Any]:
    """The phases of the last start in one server log, as a dict with exactly KEYS."""
    if isinstance(log, (bytes, bytearray)):
        log = bytes(log).decode("utf-8", errors="replace")
    if not isinstance(log, str):
        log = ""
    starts = _split_starts(_ANSI.sub("", log.replace("\x00", "")))
    start = _StartReader()
    for line in starts[-1]:
        start.read(line)
    out = start.result()
    out["starts_in_log"] = sum(1 for s in starts if s and s[0].startswith("# argv:"))
    return out


class _StartReader:
    """One start's lines, read in order: the markers' first timestamps, vLLM's own durations, the
    versions it names and the compile cache's lines."""

    def __init__(self) -> None:
        self.out: dict[str, Any] = dict.fromkeys(KEYS)
        self.found: set[str] = set()
        self.clock = _Clock()
        self.t: dict[str, datetime | None] = dict.fromkeys(_MARKERS)
        self.durations: dict[str, list[float]] = {k: [] for k in _DURATIONS}
        self.hit = self.miss = False
        self.banner_version: str | None = None
        self.engine_version: str | None = None

    def read(self, line: str) -> None:
        m = _LINE.match(line)
        ts = self.clock.at(m) if m else None
        msg = m.group("msg") if m else line
        pm = _PROC.match(line)
        proc = (pm.group("proc") if pm else "") or ""
        banner = _VERSION.search(msg) if m else None
        engine = _ENGINE.search(msg)
        if banner and self.banner_version is None:
            self.banner_version = banner.group(1)
        if engine and engine.group(1) and self.engine_version is None:
            self.engine_version = engine.group(1)
        if ts is not None:
            self._mark(ts, msg, proc, banner is not None, engine is not None)
        for key, rx in _DURATIONS.items():
            d = rx.search(msg)
            if d:
                self.durations[key].append(float(d.groups()[-1]))
                if key == "graph_capture_s" and ts is not None:
                    self.t["capture_end"] = ts
        ie = _INIT_END.search(msg)
        if ie:
            self.out["engine_init_s"] = float(ie.group(1))
            self.out["engine_compile_s"] = float(ie.group(2)) if ie.group(2) else None
            self.t["init_end"] = ts
            self.found.add("init_end")
        cd = _CACHE_DIR.search(msg)
        if cd and self.out["compile_cache_dir"] is None:
            self.out["compile_cache_dir"] = cd.group(1)
            self.found.add("compile_cache_dir")
        self.hit = self.hit or any(k in msg for k in _HIT)
        self.miss = self.miss or any(k in msg for k in _MISS)

    def _mark(self, ts: datetime, msg: str, proc: str, banner: bool, engine: bool) -> None:
        """The first timestamp of each phase boundary the line stands for."""
        t = self.t
        if t["banner"] is None and (banner or "non-default args" in msg):
            t["banner"] = ts
        if t["engine"] is None and (proc.startswith("EngineCore") or engine):
            t["engine"] = ts
        if t["worker"] is None and ("Worker" in proc or "distributed_init_method=" in msg):
            t["worker"] = ts
        if t["api_ready"] is None and any(k in msg for k in _API_READY):
            t["api_ready"] = ts

    def result(self) -> dict[str, Any]:
        out, found, t = self.out, self.found, self.t
        # the engine's own line names the version unambiguously; the banner is the fallback
        out["vllm_version"] = self.engine_version or self.banner_version
        for key, vals in self.durations.items():
            if vals:
                out[key] = max(vals)
                found.add(key.removesuffix("_s"))
        if self.hit or self.miss:
            out["compile_cache"] = "partial" if self.hit and self.miss else "hit" if self.hit else "miss"
            found.add("compile_cache_" + out["compile_cache"])
        found.update(k for k, v in t.items() if v is not None)
        out["api_to_engine_s"] = _gap(t["banner"], t["engine"])
        out["engine_to_worker_s"] = _gap(t["engine"], t["worker"])
        out["worker_to_init_end_s"] = _gap(t["worker"], t["init_end"])
        out["init_end_to_api_s"] = _gap(t["init_end"], t["api_ready"])
        out["total_logged_s"] = _gap(t["banner"], t["api_ready"])
        out["after_capture_s"] = _gap(t["capture_end"], t["init_end"])
        out["found"] = sorted(found)
        return out


def from_log_file(path: str | Path) -> dict[str, Any]:
    """parse() of a log file; an unreadable or absent file gives all None and found == ["unreadable"]."""
    try:
        data = Path(path).read_bytes()
    except OSError:
        return {**parse(""), "found": ["unreadable"]}
    return parse(data)
