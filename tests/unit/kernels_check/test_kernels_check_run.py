"""The whole kernels_check run on the CPU: the arguments resolved as the CLI resolves them, the gate
forced through the project's patch mechanism, ops counted, every row kind (routing, cell, fault,
fault_control) appended through the run store, the manifest finished, the report and figures
recomputed from the rows. The kernels are stand-ins (tests/support/kernel_standins.py: torch on the
CPU standing in for vLLM's GPU kernels, because no GPU is here), injected through the run's Kit; all
else is the code the GPU run uses, so a change to the store, the rows or the report that breaks the run
fails here (the run once died at its first row, KeyError 'rows.jsonl', with CI green)."""

from __future__ import annotations

import json

import pytest
import torch

from e2e.rundir.formats import VERSIONS
from e2e.rundir.store import KERNEL_ROWS, read_jsonl
from kernels_check import paths
from kernels_check.cli import build_parser, main, resolve
from kernels_check.run import run
from tests.support import kernel_standins as ks

ARGS = [
    "--shapes",
    "16/8,32/16",
    "--contexts",
    "40,100",
    "--batch",
    "2",
    "--reps",
    "2",
    "--graph-inner",
    "2",
    "--graph-reps",
    "2",
    "--flush-mib",
    "1",
    "--fault-dtypes",
    "bf16",
    "--fault-shapes",
    "32/16",
    "--fault-lengths",
    "64,58",
    "--fault-batch",
    "2",
]
KINDS = {"routing", "cell", "fault", "fault_control"}


@pytest.fixture
def gate(monkeypatch):
    return ks.install_gate(monkeypatch)


def _run(tmp_path, kit, run_id):
    a = build_parser().parse_args([*ARGS, "--out", str(tmp_path), "--run-id", run_id])
    rc = run(a, resolve(a), kit)
    root = tmp_path / run_id
    manifest = json.loads((root / "manifest.json").read_text())
    summary = json.loads((root / "summary.json").read_text())
    return rc, root, manifest, read_jsonl(root / KERNEL_ROWS), summary


def _pattern(summary, path):
    """(length, value, mode) -> outcome of one path's tail-fault rows."""
    return {(f["length"], f["value"], f["mode"]): f[path] for f in summary["faults"]}


def test_whole_run_on_nvidia_compares_triton_with_fa3(tmp_path, gate, capsys):
    rc, root, m, rows, s = _run(tmp_path, ks.cpu_kit(rocm="none"), "nv")
    assert rc == 0
    assert {r["kind"] for r in rows} == KINDS
    assert all(r["schema_version"] == VERSIONS["kernels"] for r in rows)
    assert m["status"] == "complete" and m["n_rows"] == len(rows) and m["n_bad_rows"] == 0
    assert m["paths"] == ["triton", "fa3"] and m["comparator"] == "fa3"
    assert not m["rocm_custom"]["available"] and "NOT available" in m["statement"]
    # Routing: gate off, then on, per shape; forced on, the dispatch calls the op, which raises here.
    routing = [
        (r["shape"]["name"], r["gate_forced"], r["steered"], bool(r["raised"])) for r in rows if r["kind"] == "routing"
    ]
    assert routing == [("16/8", False, True, False), ("32/16", False, True, False)] + [
        ("16/8", True, True, True),
        ("32/16", True, True, True),
    ]
    cells = [r for r in rows if r["kind"] == "cell"]
    assert len(cells) == 2 * 2 * 2  # shapes x contexts x paths
    assert all(r["status"] == "ok" and r["routed_as_expected"] and r["paging_round_trip"] for r in cells)
    assert all(r["score"]["status"] == "ok" and r["time_cold"]["n"] == 2 and r["time_graph"]["n"] == 2 for r in cells)
    # Report: the per-cell table with a ratio each, every control seen, correct readers clean.
    assert s["n_rows"] == len(rows) and s["n_failed"] == 0 and s["comparator"] == "fa3"
    assert len(s["cells"]) == 4 and all(c["ratio_triton_over_other"] for c in s["cells"])
    assert s["controls"] == {p: {"ran": 8, "flagged": 8, "failed": 0} for p in ("triton", "fa3")}
    assert set(_pattern(s, "triton").values()) == {"clean"} and set(_pattern(s, "fa3").values()) == {"clean"}
    assert set(s["figures"]) == {"fig_time_ratio.png", "fig_error_vs_depth.png"}
    # Layouts read against the installed vLLM inside its config context: checked or "not checked" and
    # why (the CPU build's 0.32.0 has no get_kv_cache_shape), never the missing-config error.
    assert set(m["layout_check"]) == {"rocm", "fa"}
    assert not any("config is not set" in x for x in m["layout_check"].values())
    # The summary is a function of the rows: recomputed without a GPU, the same.
    md = (root / "summary.md").read_text()
    assert main(["--report", str(root)]) == 0
    assert (root / "summary.md").read_text() == md
    assert "run folder:" in capsys.readouterr().err


def test_whole_run_on_rocm_finds_the_unmasked_tail_read(tmp_path, gate):
    """A custom kernel without the K/V load mask (vllm#53856) against a correct Triton path: the fault
    sweep, through rows and report, shows exactly the pattern the defect gives."""
    rc, _, m, rows, s = _run(tmp_path, ks.cpu_kit(rocm="ok", rocm_load_mask=False), "rocm")
    assert rc == 0 and {r["kind"] for r in rows} == KINDS
    assert m["paths"] == ["triton", "rocm_custom"] and m["rocm_custom"]["available"]
    assert "one tiny launch ran" in m["rocm_custom"]["reason"] and m["fa3"]["reason"] == "ROCm build"
    assert all(r["steered"] and r["raised"] is None for r in rows if r["kind"] == "routing")
    custom = _pattern(s, "rocm_custom")
    poisoned = {k for k, v in custom.items() if v != "clean"}
    assert poisoned == {(58, "nan", "v"), (58, "nan", "kv")}  # V's NaN past seq_len, never K alone
    assert set(_pattern(s, "triton").values()) == {"clean"}
    assert s["controls"]["rocm_custom"] == {"ran": 8, "flagged": 8, "failed": 0}


def test_a_build_without_code_for_this_gpu_says_so_once(tmp_path, gate, capsys):
    """The op is registered but cannot launch on this GPU: one line, no failed rows, Triton alone."""
    rc, _, m, rows, s = _run(tmp_path, ks.cpu_kit(rocm="no-code"), "nocode")
    assert rc == 0 and s["n_failed"] == 0
    assert m["paths"] == ["triton"] and m["comparator"] is None
    why = m["rocm_custom"]["reason"]
    assert not m["rocm_custom"]["available"] and "one tiny launch" in why and "gfx1100" in why
    assert "invalid device function" in why and "\n" not in why
    assert not any(r.get("path") == "rocm_custom" for r in rows)
    said = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("ROCm custom kernel:")]
    assert said == [f"ROCm custom kernel: {why}"]


def test_a_row_the_store_cannot_write_is_an_error_naming_the_files_it_knows(tmp_path):
    from e2e.rundir.store import RunStore

    with RunStore.create(tmp_path / "r") as store, pytest.raises(ValueError, match=r"'rowz.jsonl'.*rows\.jsonl"):
        store.append("rowz.jsonl", {"kind": "cell"})


# -- layouts against a backend's own KV view -------------------------------------------------------
class Rocm026:
    """vLLM 0.26.0's RocmAttentionBackend.get_kv_cache_shape (no stride order: identity)."""

    @staticmethod
    def get_kv_cache_shape(num_blocks, block_size, num_kv_heads, head_size, cache_dtype_str="auto"):
        return (2, num_blocks, block_size, num_kv_heads, head_size)


class RocmBlocksFirst(Rocm026):
    """Blocks before K/V (0.32.0's logical order, which its forward transposes first): split as 0.26.0
    splits it, the kernel would read block 0's K and V as two blocks."""

    @staticmethod
    def get_kv_cache_shape(num_blocks, block_size, num_kv_heads, head_size, cache_dtype_str="auto"):
        return (num_blocks, 2, block_size, num_kv_heads, head_size)


class Fa026:
    """vLLM 0.26.0's FlashAttentionBackend shape and NHD stride order."""

    @staticmethod
    def get_kv_cache_shape(num_blocks, block_size, num_kv_heads, head_size, cache_dtype_str="auto"):
        return (num_blocks, num_kv_heads, block_size, 2 * head_size)

    @staticmethod
    def get_kv_cache_stride_order():
        return (0, 2, 1, 3)


class FaHnd(Fa026):
    @staticmethod
    def get_kv_cache_stride_order():
        return (0, 1, 2, 3)


def test_layouts_are_read_against_the_backends_own_kv_view():
    """The backend's cache as the model runner allocates it, split as its forward splits it; a backend
    laying the cache out otherwise is named DIFFERENT (the classes here stand in for 0.26.0's, which
    the CPU build's vLLM no longer has)."""
    split = pytest.importorskip("vllm.v1.attention.ops.paged_attn").PagedAttention.split_kv_cache  # unchanged in 0.32
    dt = torch.bfloat16
    assert paths.rocm_layout(Rocm026, split, dt, 4, 64, 16, "cpu").startswith("same as Rocm026 shape (2, 3, 16, 4, 64)")
    assert paths.rocm_layout(RocmBlocksFirst, split, dt, 4, 64, 16, "cpu").startswith("DIFFERENT")
    assert paths.fa_layout(Fa026, dt, 4, 64, 16, "cpu").startswith("same as Fa026 shape (3, 4, 16, 128)")
    assert paths.fa_layout(FaHnd, dt, 4, 64, 16, "cpu").startswith("DIFFERENT")


def test_the_installed_vllm_config_context_lets_the_layout_be_read():
    """vLLM's FlashAttention stride order needs a current config: the context kernels_check enters."""
    pytest.importorskip("vllm")
    from vllm.config import get_current_vllm_config

    with pytest.raises(AssertionError, match="config is not set"):
        get_current_vllm_config()
    with paths.vllm_config_context():
        assert get_current_vllm_config() is not None


def test_the_real_kit_describes_its_gpu_with_the_machines_driver(monkeypatch):
    """gpu_kit's description of the GPU (torch's properties and e2e/gpu/gpu_driver.py's reading) runs
    here with torch.cuda's answers stood in (no GPU on this machine): the H100 run of 2026-12-06 stopped
    at it with an AttributeError after the driver reading moved, since the stand-in kit never calls it."""
    from types import SimpleNamespace

    import torch

    from kernels_check import kit

    props = SimpleNamespace(gcnArchName=None, total_memory=80 * 2**30)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda d: props)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda d: "NVIDIA H100 80GB HBM3")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda d: (9, 0))
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    got = kit._describe(torch.device("cuda", 0))
    assert got["name"] == "NVIDIA H100 80GB HBM3" and got["capability"] == [9, 0] and got["memory_gib"] == 80.0
