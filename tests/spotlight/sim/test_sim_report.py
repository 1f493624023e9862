"""What `spotlight simulate` prints and plots, read as a buyer reads it (issue 42, item 12): a table
no wider than 100 columns that keeps every column, one picture of hours and dollars to the target
with the frontier marked, every line of the figure named, every text inside it, and a headline
that says which policy reaches the target first when it is not spotlight."""

import copy

import matplotlib.text
import pytest

from schedulers.traces import Trace, TraceEvent
from spotlight.sim.config import SimConfig
from spotlight.sim.report import frontier, plot_simulation, table, verdict
from spotlight.sim.simulator import POLICIES, simulate

LONG_NAME = "experiments/traces/" + "a-users-own-trace-with-a-long-descriptive-name-" * 2 + "2026.csv"


@pytest.fixture(scope="module")
def result():
    """Every policy on a small run: n0 preempted at 100 s, n4 joining at 200 s (~2 s to simulate)."""
    trace = Trace([TraceEvent(0.0, "add", f"n{k}") for k in range(4)]
                  + [TraceEvent(100.0, "remove", "n0"), TraceEvent(200.0, "add", "n4"),
                     TraceEvent(36_000.0, "remove", "n1")], LONG_NAME)
    cfg = SimConfig(gpus=4, spot_gpus=8, prompts=8, group_size=4, samples_per_request=4, iterations=40,
                    candidates_per_prompt=8, plan_prompts=4, stop_at_target=True, micro_batch=8,
                    parts_per_request=1, iterations_scale=1.0)
    return simulate(cfg, trace, list(POLICIES))


def _reached(result):
    return {n: (r["time_to_target_h"], r["cost_usd"]) for n, r in result["policies"].items()
            if r["time_to_target_h"] is not None and not POLICIES[n].oracle}


def test_the_table_fits_100_columns_and_keeps_every_column_for_every_policy(result):
    out = table(result)
    assert max(len(line) for line in out.splitlines()) <= 100, out  # 225 before
    blocks = out.split("\n\n")
    assert len(blocks) > 1
    columns = ("hours to target", "cost $", "speed-up vs ondemand", "cost vs ondemand", "speed-up vs ondemand_total",
               "cost vs ondemand_total", "GPU util", "preemptions", "steps redone", "iterations", "final score",
               "spent $", "stopped at")
    assert all(sum(c in block.splitlines()[0] for block in blocks) >= 1 for c in columns)
    for block in blocks:  # each block under the policy names, one row each
        rows = block.splitlines()
        assert rows[0].startswith("policy ")
        assert [r.split()[0] for r in rows[1:1 + len(POLICIES)]] == list(POLICIES)
    # The answer first: hours and dollars to target, then the comparison with ondemand.
    assert blocks[0].splitlines()[0].split("  ")[0:1] == ["policy"]
    head = blocks[0].splitlines()[0]
    assert head.index("hours to target") < head.index("cost $") < head.index("speed-up vs ondemand")


def test_the_headline_says_which_policy_reaches_the_target_first(result):
    reached = _reached(result)
    first = min(reached, key=lambda n: reached[n])
    assert first == "ondemand_total"  # 12 on-demand GPUs beat 4 on-demand + up to 8 spot here
    (t1, c1), (t2, c2) = reached[first], reached["spotlight"]
    said = f"ondemand_total reaches it first ({t1:.2f} h, ${c1:.2f} against {t2:.2f} h, ${c2:.2f})"
    assert said in verdict(result)
    assert said in " ".join(table(result).split())  # the line under the table (wrapped)
    # When spotlight is the first, nothing more is said.
    sooner = copy.deepcopy(result)
    sooner["policies"]["spotlight"]["time_to_target_h"] = t1 / 2
    assert "first" not in verdict(sooner) and "first" not in table(sooner)


def test_the_plot_is_one_picture_of_hours_and_dollars_with_the_frontier_and_every_line_named(result, tmp_path):
    fig = plot_simulation(result, tmp_path / "sim.png")
    answer, score, cost, gpus = fig.axes
    pols = result["policies"]
    assert (answer.get_xlabel(), answer.get_ylabel()) == ("hours to target", "dollars to target")
    points = {l.get_label(): (l.get_xdata()[0], l.get_ydata()[0]) for l in answer.get_lines() if l.get_label() in pols}
    assert points == {n: (r["time_to_target_h"], r["cost_usd"]) for n, r in pols.items()}
    # The frontier, found here by hand: no other policy both sooner and cheaper (the oracle left out).
    reached = _reached(result)
    expected = sorted((n for n, (t, c) in reached.items()
                       if not any(t2 <= t and c2 <= c and (t2, c2) != (t, c) for t2, c2 in reached.values())),
                      key=lambda n: reached[n])
    assert frontier(result) == expected and "ondemand_total" in expected and "spot_restart" not in expected
    (ringed,) = [l for l in answer.get_lines() if l.get_label() == "frontier"]
    assert list(zip(ringed.get_xdata(), ringed.get_ydata())) == [reached[n] for n in expected]
    named = " ".join(t.get_text() for t in answer.texts)
    assert all(n in named for n in pols)
    # Every line of the panels over time is a policy's (the preemption ticks aside), in the legend.
    (legend,) = fig.legends
    assert set(pols) <= {t.get_text() for t in legend.get_texts()}
    for ax in (score, cost, gpus):
        labels = [l.get_label() for l in ax.get_lines() if not l.get_label().startswith("_")]
        assert set(pols) <= set(labels), ax.get_ylabel()
    assert all(l.get_label() in pols or l.get_label().endswith("in the longest spot run") for l in gpus.get_lines())
    # Every text inside the figure: the title with its long trace name, the headline, the legend.
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    canvas = FigureCanvasAgg(fig)  # the figure comes back closed: drawn again, as it was saved
    canvas.draw()
    renderer = canvas.get_renderer()
    box = fig.bbox
    texts = [t for t in fig.findobj(matplotlib.text.Text) if t.get_visible() and t.get_text()]
    assert any("a-users-own-trace" in t.get_text() for t in texts)
    for t in texts:
        e = t.get_window_extent(renderer)
        assert box.x0 - 1 <= e.x0 and e.x1 <= box.x1 + 1 and box.y0 - 1 <= e.y0 and e.y1 <= box.y1 + 1, t.get_text()
