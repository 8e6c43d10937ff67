"""Planning: counterbalanced orders, pass numbering, dry-run output. Pure, no server."""
from __future__ import annotations

import json

from e2e.cli import main
from e2e.config import parse_config
from e2e.plan import make_plan


def cfg(order="stock-first", passes=None, mode="fresh", arms=("stock", "widened")):
    run = {"order": order}
    if passes:
        run["passes"] = passes
    return parse_config({"model": {"path": "m"}, "workload": {"depths": [8192, 1024]},
                         "server": {"mode": mode}, "run": run,
                         "arms": [{"name": a} for a in arms]})


def seq(cells):
    return [(c.pass_, c.depth, c.arm) for c in cells]


def test_widened_first_one_pass_depths_ascending():
    assert seq(make_plan(cfg("widened-first", passes=1))) == [
        (1, 1024, "widened"), (1, 1024, "stock"), (1, 8192, "widened"), (1, 8192, "stock")]


def test_the_missions_command_plans_enough_servers_for_a_verdict():
    """`--order widened-first` names the arm that leads pass 1; with no passes given the plan has
    DEFAULT_PASSES (4) passes alternating the lead, so every arm gets four servers per depth."""
    from e2e.config import DEFAULT_PASSES

    cells = make_plan(cfg("widened-first"))
    assert DEFAULT_PASSES == 4 and {c.pass_ for c in cells} == {1, 2, 3, 4}
    leads = [next(c.arm for c in cells if c.pass_ == p) for p in (1, 2, 3, 4)]
    assert leads == ["widened", "stock", "widened", "stock"]
    assert all(sum(1 for c in cells if c.arm == a and c.depth == d) == 4
               for a in ("stock", "widened") for d in (1024, 8192))


def test_next_pass_continues_the_alternation():
    from e2e.plan import next_pass

    c = cfg("widened-first", passes=2)
    cells = make_plan(c)
    more = next_pass(c, cells)
    assert [(x.pass_, x.arm) for x in more][:1] == [(3, "widened")]
    assert [x.index for x in more] == list(range(len(cells), len(cells) + len(more)))
    assert cells + more == make_plan(c, passes=3)


def test_both_is_two_passes_stock_then_widened_first():
    s = seq(make_plan(cfg("both", passes=2)))
    assert s[:4] == [(1, 1024, "stock"), (1, 1024, "widened"), (1, 8192, "stock"), (1, 8192, "widened")]
    assert s[4:] == [(2, 1024, "widened"), (2, 1024, "stock"), (2, 8192, "widened"), (2, 8192, "stock")]


def test_passes_alternate_and_indices_are_consecutive():
    cells = make_plan(cfg("stock-first", passes=3))
    assert [c.index for c in cells] == list(range(12))
    firsts = [c.arm for c in cells if c.depth == 1024][::2]
    assert firsts == ["stock", "widened", "stock"]
    assert len({c.cell_id for c in cells}) == 12


def test_per_arm_pass_mode_groups_depths_of_an_arm_on_one_server():
    cells = make_plan(cfg("stock-first", passes=1, mode="per-arm-pass"))
    assert seq(cells) == [(1, 1024, "stock"), (1, 8192, "stock"), (1, 1024, "widened"), (1, 8192, "widened")]
    assert len({c.server_key for c in cells}) == 2


def test_three_arms_reverse_on_second_pass():
    cells = make_plan(cfg("both", passes=2, arms=("fa", "rocm", "triton")))
    assert [c.arm for c in cells if c.depth == 1024] == ["fa", "rocm", "triton", "triton", "rocm", "fa"]


def test_dry_run_json_schema(capsys, in_root):
    assert main(["--config", "configs/gemma3-27b-it-w4a16-tp2.toml", "--order", "both", "--passes", "2",
                 "--dry-run", "--json"]) == 0
    cells = json.loads(capsys.readouterr().out)
    assert len(cells) == 12
    assert cells[0] == {"index": 0, "cell_id": "p1-d1024-stock", "pass": 1, "arm": "stock",
                        "depth": 1024, "server_key": "p1-d1024-stock"}
    assert {c["pass"] for c in cells} == {1, 2}


def test_dry_run_table_starts_nothing(capsys, in_root):
    assert main(["--order", "widened-first", "--dry-run", "--depths", "1024"]) == 0
    out = capsys.readouterr().out
    assert "p1-d1024-widened" in out and "p1-d1024-stock" in out


def test_compile_cache_is_per_arm_and_interpreter(tmp_path):
    from e2e.config import parse_config
    from e2e.launch import server_spec

    c = parse_config({"model": {"path": "m"}, "workload": {"depths": [16]},
                      "arms": [{"name": "a"}, {"name": "b"}, {"name": "c", "python": "/other/python"},
                               {"name": "d", "env": {"VLLM_CACHE_ROOT": "/mine"}}]})
    root = {a.name: server_spec(c, a, None, tmp_path).env.get("VLLM_CACHE_ROOT") for a in c.arms}
    assert root["a"] == server_spec(c, c.arm("a"), None, tmp_path).env["VLLM_CACHE_ROOT"]  # reused
    assert len({root["a"], root["b"], root["c"]}) == 3 and all(str(tmp_path) in root[x] for x in "abc")
    assert root["d"] == "/mine"  # an arm's own setting wins
    shared = parse_config({**c.model_dump(mode="json"), "server": {"compile_cache": "vllm-default"}})
    assert "VLLM_CACHE_ROOT" not in server_spec(shared, shared.arm("a"), None, tmp_path).env
