"""Planning: counterbalanced orders, pass numbering, dry-run output. Pure, no server."""

from __future__ import annotations

import json

from e2e.cli import main
from e2e.design.config import parse_config
from e2e.design.plan import make_plan


def cfg(order="stock-first", passes=None, mode="fresh", arms=("stock", "widened")):
    run = {"order": order}
    if passes:
        run["passes"] = passes
    return parse_config(
        {
            "model": {"path": "m"},
            "workload": {"depths": [8192, 1024]},
            "server": {"mode": mode},
            "run": run,
            "arms": [{"name": a} for a in arms],
        }
    )


def seq(cells):
    return [(c.pass_, c.depth, c.arm) for c in cells]


def test_widened_first_one_pass_depths_ascending():
    assert seq(make_plan(cfg("widened-first", passes=1))) == [
        (1, 1024, "widened"),
        (1, 1024, "stock"),
        (1, 8192, "widened"),
        (1, 8192, "stock"),
    ]


def test_the_missions_command_plans_enough_servers_for_a_verdict():
    """`--order widened-first` names the arm that leads pass 1; with no passes given the plan has
    DEFAULT_PASSES (4) passes alternating the lead, so every arm gets four servers per depth."""
    from e2e.design.config import DEFAULT_PASSES

    cells = make_plan(cfg("widened-first"))
    assert DEFAULT_PASSES == 4 and {c.pass_ for c in cells} == {1, 2, 3, 4}
    leads = [next(c.arm for c in cells if c.pass_ == p) for p in (1, 2, 3, 4)]
    assert leads == ["widened", "stock", "widened", "stock"]
    assert all(
        sum(1 for c in cells if c.arm == a and c.depth == d) == 4 for a in ("stock", "widened") for d in (1024, 8192)
    )


def test_next_pass_continues_the_alternation():
    from e2e.design.plan import next_pass

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
    assert (
        main(
            [
                "--config",
                "configs/gemma3-27b-it-w4a16-tp2.toml",
                "--model",
                "assets/SmolLM2-135M-Instruct",  # a local model folder: the dry run checks it, as the run does
                "--order",
                "both",
                "--passes",
                "2",
                "--dry-run",
                "--json",
            ]
        )
        == 0
    )
    cells = json.loads(capsys.readouterr().out)
    assert len(cells) == 12
    assert cells[0] == {
        "index": 0,
        "cell_id": "p1-d1024-stock",
        "pass": 1,
        "arm": "stock",
        "depth": 1024,
        "server_key": "p1-d1024-stock",
    }
    assert {c["pass"] for c in cells} == {1, 2}


def test_dry_run_table_starts_nothing(capsys, in_root):
    # The default config names a model folder this checkout does not have: the table, then the refusal.
    assert main(["--order", "widened-first", "--dry-run", "--depths", "1024"]) == 2
    out, err = capsys.readouterr()
    assert "p1-d1024-widened" in out and "p1-d1024-stock" in out
    assert "error: model.path 'gemma-3-27b-it-w4a16' is not a local model folder" in err


def test_compile_cache_is_per_arm_and_interpreter(tmp_path):
    from e2e.design.config import parse_config
    from e2e.serve.launch import server_spec

    c = parse_config(
        {
            "model": {"path": "m"},
            "workload": {"depths": [16]},
            "arms": [
                {"name": "a"},
                {"name": "b"},
                {"name": "c", "python": "/other/python"},
                {"name": "d", "env": {"VLLM_CACHE_ROOT": "/mine"}},
            ],
        }
    )
    root = {a.name: server_spec(c, a, None, tmp_path).env.get("VLLM_CACHE_ROOT") for a in c.arms}
    assert root["a"] == server_spec(c, c.arm("a"), None, tmp_path).env["VLLM_CACHE_ROOT"]  # reused
    assert len({root["a"], root["b"], root["c"]}) == 3 and all(str(tmp_path) in root[x] for x in "abc")
    assert root["d"] == "/mine"  # an arm's own setting wins
    shared = parse_config({**c.model_dump(mode="json"), "server": {"compile_cache": "vllm-default"}})
    assert "VLLM_CACHE_ROOT" not in server_spec(shared, shared.arm("a"), None, tmp_path).env


# -- slots: arms spread over GPUs / nodes (a blocking factor), with fake slots --------------------
from collections import Counter  # noqa: E402

import pytest  # noqa: E402
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from e2e.design.plan import assign_slots, server_groups, slot_balance  # noqa: E402
from e2e.run.executors.slots import make_slots  # noqa: E402


def gpu_node(i, gpus, host=None, cpus=32):
    return {
        "NodeID": f"node{i:02d}",
        "Alive": True,
        "NodeManagerAddress": host or f"10.0.0.{i}",
        "Resources": {"CPU": cpus, "GPU": gpus},
    }


def plan_on(slots, passes=4, mode="fresh", arms=("stock", "widened"), depths=(1024, 8192)):
    c = parse_config(
        {
            "model": {"path": "m"},
            "workload": {"depths": list(depths)},
            "server": {"mode": mode},
            "run": {"order": "both", "passes": passes},
            "arms": [{"name": a} for a in arms],
        }
    )
    cells = make_plan(c)
    names = [s.name for s in slots]
    a = assign_slots(cells, len(slots), list(arms))
    return cells, a, slot_balance(cells, a, names)


def per_unit(cells, a, names):
    """(arm, depth) -> Counter of slots over passes."""
    out = {}
    for g in server_groups(cells):
        out.setdefault((g[0].arm, g[0].depth), Counter())[names[a[g[0].server_key]]] += 1
    return out


def test_eight_gpus_at_tp2_four_slots_each_arm_once_per_slot_per_depth():
    one = make_slots([gpu_node(0, 8)], tp=2)  # the default cap: one cell at a time on the host
    assert [s.name for s in one] == ["n0.g0-1"]
    slots = make_slots([gpu_node(0, 8)], tp=2, max_per_host=4)
    assert [(s.name, s.gpus) for s in slots] == [
        ("n0.g0-1", (0, 1)),
        ("n0.g2-3", (2, 3)),
        ("n0.g4-5", (4, 5)),
        ("n0.g6-7", (6, 7)),
    ]
    assert {s.cpus for s in slots} == {8.0}  # the node's 32 CPUs shared by its 4 slots
    cells, a, bal = plan_on(slots, passes=4)
    names = [s.name for s in slots]
    assert bal["balanced"] and bal["problem"] is None
    for unit, c in per_unit(cells, a, names).items():
        assert c == Counter({n: 1 for n in names}), unit  # a Latin square: each slot once
    for p in (1, 2, 3, 4):  # within a pass the four servers sit on four different GPU pairs
        assert len({a[c.server_key] for c in cells if c.pass_ == p}) == 4


def test_three_nodes_of_eight_cannot_balance_four_passes_and_says_how_to():
    nodes = [gpu_node(i, 8) for i in range(3)]
    slots = make_slots(nodes, tp=2)  # one slot per host at the default cap
    assert [s.name for s in slots] == ["n0.g0-1", "n1.g0-1", "n2.g0-1"]
    _, _, bal = plan_on(slots, passes=4)
    assert not bal["balanced"]
    assert "4 pass(es) is not a multiple of 3" in bal["problem"] and "2/1/1" in bal["problem"]
    assert bal["suggest"] == "use --passes 6 (a multiple of 3) or --max-slots 2"
    assert plan_on(slots, passes=6)[2]["balanced"]
    assert plan_on(make_slots(nodes, tp=2, max_slots=2), passes=4)[2]["balanced"]
    # Four at once per host: 12 slots, host-first so --max-slots keeps them spread over the hosts.
    wide = make_slots(nodes, tp=2, max_per_host=4)
    assert len(wide) == 12 and [s.host for s in wide[:3]] == ["10.0.0.0", "10.0.0.1", "10.0.0.2"]
    _, _, bal = plan_on(wide, passes=4)
    assert not bal["balanced"] and bal["suggest"].endswith("--max-slots 4")
    assert {s.host for s in make_slots(nodes, tp=2, max_per_host=4, max_slots=4)} == {
        "10.0.0.0",
        "10.0.0.1",
        "10.0.0.2",
    }


def test_uneven_nodes_give_slots_by_their_gpus_and_balance_over_a_multiple_of_passes():
    nodes = [gpu_node(0, 8), gpu_node(1, 4), gpu_node(2, 2), gpu_node(3, 1)]  # node 3 cannot hold TP 2
    slots = make_slots(nodes, tp=2, max_per_host=4)
    assert [s.name for s in slots] == ["n0.g0-1", "n1.g0-1", "n2.g0-1", "n0.g2-3", "n1.g2-3", "n0.g4-5", "n0.g6-7"]
    assert {s.name: s.cpus for s in slots}["n2.g0-1"] == 32.0 and slots[0].cpus == 8.0
    cells, a, bal = plan_on(slots, passes=7)
    assert bal["balanced"]
    assert all(c == Counter({s.name: 1 for s in slots}) for c in per_unit(cells, a, [s.name for s in slots]).values())
    assert not plan_on(slots, passes=4)[2]["balanced"]


def test_per_arm_pass_groups_balance_per_arm_and_keep_depths_together():
    slots = make_slots([gpu_node(0, 2), gpu_node(1, 2)], tp=2)
    cells, a, bal = plan_on(slots, passes=4, mode="per-arm-pass")
    assert bal["balanced"] and set(bal["counts"]) == {"stock", "widened"}
    assert all(v == 2 for c in bal["counts"].values() for v in c.values())
    assert len(a) == 8  # one slot per arm-pass server, whatever its depths


def test_no_usable_node_is_one_line():
    from e2e.errors import UserError

    with pytest.raises(UserError, match="need 4 GPU"):
        make_slots([gpu_node(0, 2)], tp=4)


def test_adding_passes_keeps_every_earlier_slot():
    """Adaptive replication and --resume extend a plan: the assignment of what ran never moves."""
    slots = make_slots([gpu_node(i, 8) for i in range(3)], tp=2)
    c4, a4, _ = plan_on(slots, passes=4)
    c5, a5, _ = plan_on(slots, passes=5)
    assert all(a5[k] == v for k, v in a4.items())


@settings(max_examples=200, deadline=None)
@given(k=st.integers(1, 4), d=st.integers(1, 3), s=st.integers(1, 6), rounds=st.integers(1, 3), extra=st.integers(0, 5))
def test_balanced_exactly_when_the_passes_are_a_multiple_of_the_slots(k, d, s, rounds, extra):
    arms = tuple(f"arm{i}" for i in range(k))
    depths = tuple(128 * (i + 1) for i in range(d))
    names = [f"s{i}" for i in range(s)]
    passes = s * rounds + (extra % s)
    c = parse_config(
        {
            "model": {"path": "m"},
            "workload": {"depths": list(depths)},
            "run": {"order": "both", "passes": passes},
            "arms": [{"name": x} for x in arms],
        }
    )
    cells = make_plan(c)
    a = assign_slots(cells, s, list(arms))
    bal = slot_balance(cells, a, names)
    assert bal["balanced"] == (passes % s == 0)
    for cnt in per_unit(cells, a, names).values():  # never more than one apart
        assert max(cnt.values()) - min(cnt.get(n, 0) for n in names) <= 1
    if k * d <= s:  # enough slots: a pass's servers all on different slots
        for p in range(1, passes + 1):
            keys = [x.server_key for x in cells if x.pass_ == p]
            assert len({a[key] for key in keys}) == len(keys)
