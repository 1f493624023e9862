"""experiments/exploration_value.py: what exploration buys, `spotlight` against `spotlight_noexplore`."""

import json

from experiments import exploration_value as ev
from schedulers.traces import Trace, TraceEvent

SMALL = dict(prompts=8, group_size=4, candidates_per_prompt=16, plan_prompts=4, iterations=40, iterations_scale=0.5)
"""A run of a few iterations (the random seeds reach the target in ~9) on 2 on-demand GPUs."""


def fleet(nodes: int) -> Trace:
    return Trace([TraceEvent(0.0, "add", f"n{k}") for k in range(nodes)], "handmade")


def test_what_exploration_buys_is_the_difference_of_the_two_policies():
    # qwen-image-full: a spot H100 cannot hold the update, so every arm trains on the on-demand GPUs
    # and `spotlight`'s spot GPUs explore through every update, as `spotlight_learner_update`'s do.
    result = ev.measure(fleet(4), "qwen-image-full", 8, gpus=2, **SMALL)
    p = result["policies"]
    assert set(p) == set(ev.ARMS)
    explore, plain = p["spotlight"], p["spotlight_noexplore"]
    bought = ev.buys(result)
    assert bought == {"iterations": plain["iterations_to_target"] - explore["iterations_to_target"],
                      "hours": plain["time_to_target_h"] - explore["time_to_target_h"],
                      "dollars": plain["cost_usd"] - explore["cost_usd"]}
    assert bought["iterations"] > 0 and bought["hours"] > 0  # here exploring saves
    assert explore["fleet_update_iterations"] == plain["fleet_update_iterations"] == 0
    assert explore["explored_samples"] > 0 == plain["explored_samples"]
    assert {k: explore[k] for k in ("iterations_to_target", "explored_samples")} == \
        {k: p["spotlight_learner_update"][k] for k in ("iterations_to_target", "explored_samples")}

    text = ev.table([result])
    lines = text.splitlines()
    head = "| " + " | ".join(ev.COLUMNS) + " |"
    arms = lines[lines.index(head) + 2:lines.index(head) + 2 + len(ev.ARMS)]
    assert [row.split(" | ")[2] for row in arms] == [f"`{a}`" for a in ev.ARMS]
    assert all(len(row.strip("| ").split(" | ")) == len(ev.COLUMNS) for row in arms)
    first = arms[0].strip("| ").split(" | ")
    assert first[3] == str(explore["iterations_to_target"]) and first[7] == f"{explore['explored_samples']:,}"
    buys_head = "| " + " | ".join(ev.BUYS_COLUMNS) + " |"
    cells = lines[lines.index(buys_head) + 2].strip("| ").split(" | ")
    assert len(cells) == len(ev.BUYS_COLUMNS)
    assert cells[2] == (f"{bought['iterations']:+d} "
                        f"({100 * bought['iterations'] / plain['iterations_to_target']:+.1f}%)")
    assert cells[3].startswith(f"{bought['hours']:+.2f} h") and cells[4].startswith(f"+${bought['dollars']:,.0f}")


def test_nothing_bought_and_a_cost_are_said_so():
    result = {"profile": "p", "config": {"spot_gpus_peak": 8}, "policies": {
        "spotlight": {"iterations_to_target": 10, "time_to_target_h": 2.0, "cost_usd": 110.0,
                      "fleet_update_iterations": 10},
        "spotlight_noexplore": {"iterations_to_target": 10, "time_to_target_h": 1.5, "cost_usd": 100.0,
                                "fleet_update_iterations": 10}}}
    assert ev.buys(result) == {"iterations": 0, "hours": -0.5, "dollars": -10.0}
    assert ev.buys_row(result) == "| `p` | 8 | 0 (nothing) | -0.50 h (-33.3%) | -$10 (-10.0%) | 10 / 10 |"
    result["policies"]["spotlight"]["time_to_target_h"] = None
    assert ev.buys(result)["hours"] is None and " - |" in ev.buys_row(result)


def test_the_script_writes_both_tables(tmp_path):
    trace = tmp_path / "t.csv"
    trace.write_text("0,add,a\n0,add,b\n")
    out, js = tmp_path / "table.md", tmp_path / "runs.json"
    assert ev.main(["--trace", str(trace), "--gpus", "2", "--sizes", "2", "--profiles", "tiny-cpu", "--prompts", "8",
                    "--iterations-scale", "0.5", "--out", str(out), "--json", str(js)]) == 0
    text = out.read_text()
    assert text.count("| `tiny-cpu` | 4 |") == len(ev.ARMS) + 1  # a row per arm, and what exploration buys
    runs = json.loads(js.read_text())
    assert [r["profile"] for r in runs] == ["tiny-cpu"] and "timeline" not in runs[0]["policies"]["spotlight"]
    assert runs[0]["config"]["spot_gpus_peak"] == 4
