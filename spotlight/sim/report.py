"""What `spotlight simulate` and `spotlight traces show` print and plot: a terminal table and a
matplotlib figure (Agg backend: no display needed)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

def plural(count: int, noun: str, many: str | None = None) -> str:
    """`count` and its noun, in the plural unless it is 1: "1 iteration", "2 iterations"."""
    return f"{count} {noun if count == 1 else many or noun + 's'}"


COLUMNS = (("time_to_target_h", "hours to target", "{:.2f}"), ("cost_usd", "cost $", "{:,.0f}"),
           ("gpu_utilization", "GPU util", "{:.0%}"), ("preemptions", "preemptions", "{}"),
           ("steps_recomputed", "steps redone", "{}"), ("iterations_to_target", "iterations", "{}"),
           ("final_score", "final score", "{:.3f}"), ("total_cost_usd", "spent $", "{:,.0f}"),
           ("stop_reason", "stopped at", "{}"))


def _vs_ondemand(ratio: float) -> str:
    """A policy's cost over ondemand's, said both ways: "0.59x (41% less)", "1.70x (70% more)"."""
    if abs(ratio - 1.0) < 0.005:
        return f"{ratio:.2f}x (same)"
    return f"{ratio:.2f}x ({abs(ratio - 1.0):.0%} {'less' if ratio < 1.0 else 'more'})"


TABLE_BASELINES = ("ondemand", "ondemand_total")
"""The baselines the terminal table compares with (all four are in `--json`): on-demand GRPO on
the same on-demand GPUs, and on as many GPUs in all, every one on-demand."""


def table(result: dict[str, Any]) -> str:
    """One row per policy, with its speed-up and its cost against each of `TABLE_BASELINES` that was
    simulated (the `speedup_vs_*` / `cost_ratio_vs_*` fields): above 1x is sooner, below 1x
    cheaper, with the cost difference in words so that neither reads backwards."""
    pols = result["policies"]
    bases = [b for b in TABLE_BASELINES if b in pols]
    head = ["policy"] + [c[1] for c in COLUMNS] + [h for b in bases for h in (f"speed-up vs {b}", f"cost vs {b}")]
    rows = [head]
    for name, r in pols.items():
        cells = [name] + ["-" if r.get(k) is None else fmt.format(r[k]) for k, _, fmt in COLUMNS]
        for b in bases:
            speedup, cost = r.get(f"speedup_vs_{b}"), r.get(f"cost_ratio_vs_{b}")
            cells += ["-" if speedup is None else f"{speedup:.2f}x", "-" if cost is None else _vs_ondemand(cost)]
        rows.append(cells)
    widths = [max(len(row[i]) for row in rows) for i in range(len(head))]
    lines = ["  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths))) for row in rows]
    c = result["config"]
    lines.append(f"({c['gpus']} on-demand + up to {c['spot_gpus_peak']} spot {c['gpu']} GPUs at "
                 f"${c['price_per_gpu_h']['ondemand']:.2f} / ${c['price_per_gpu_h']['spot']:.2f} per GPU-hour "
                 f"({c['price_per_gpu_h']['priced_from']}: {c['price_source']}), "
                 f"{c['resolution']}px, {c['prompts']}x{c['group_size']} samples per iteration; trace {result['trace']})")
    if bases:
        defined = {"ondemand": f"ondemand: {c['gpus']} on-demand GPUs",
                   "ondemand_total": f"ondemand_total: {c['ondemand_total_gpus']} on-demand GPUs "
                                     f"({c['gpus']} + the spot fleet's peak)"}
        lines.append("(speed-up: the baseline's hours to target / the policy's, above 1x is sooner; cost: the policy's "
                     "dollars to target / the baseline's, below 1x is cheaper; " + "; ".join(defined[b] for b in bases)
                     + "; --json also compares with spot_restart and sync_explore when they were simulated)")
    return "\n".join(lines)


def plot_simulation(result: dict[str, Any], path: str | Path) -> None:
    """Live GPUs over time, one panel per policy (on one panel the policies' lines hide each other:
    they share the trace, so most of them coincide), and every policy's validation score below,
    each with its own colour, line style and markers."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pols = result["policies"]
    n = len(pols)
    fig, axes = plt.subplots(n + 1, 1, figsize=(9, 1.3 * n + 3.6), sharex=True,
                             gridspec_kw={"height_ratios": [1] * n + [2.6]}, squeeze=False)
    axes = axes[:, 0]
    styles = ["-", "--", "-.", ":"]
    markers = ["o", "s", "^", "D", "v", "P", "X", "*"]
    peak = max((p[1] for r in pols.values() for p in r["timeline"]), default=1)
    for i, (name, r) in enumerate(pols.items()):
        colour = f"C{i % 10}"
        ax = axes[i]
        ax.step([p[0] for p in r["timeline"]], [p[1] for p in r["timeline"]], where="post", color=colour, lw=1.2)
        ax.set_ylim(0, peak * 1.15 + 1)
        ax.set_ylabel("GPUs", fontsize=8)
        ax.text(1.01, 0.5, name, transform=ax.transAxes, va="center", ha="left", fontsize=9, color=colour,
                fontweight="bold")
        ax.tick_params(labelsize=8)
        prog = r["progress"]
        axes[-1].plot([p[0] for p in prog], [p[1] for p in prog], color=colour, ls=styles[i % len(styles)],
                      marker=markers[i % len(markers)], markevery=max(1, len(prog) // 12), ms=4, lw=1.4, label=name)
    axes[-1].axhline(result["progress_model"]["target"], color="grey", ls="--", lw=1, label="target")
    axes[-1].set_ylabel("validation score (model)")
    axes[-1].set_xlabel("hours")
    axes[-1].legend(fontsize=8, ncol=2)
    axes[0].set_title(f"live GPUs (paid) per policy, and validation score; trace {result['trace']}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def trace_table(summary: dict[str, Any]) -> str:
    s = summary
    lines = [f"{s['source']}: {plural(s['events'], 'event')}, {plural(s['nodes'], 'distinct node')} over "
             f"{s['duration_h']:.1f} h; live nodes max {s['max_live']}, mean {s['mean_live']:.1f}; "
             f"{plural(s['preemptions'], 'preemption')} "
             f"({s['preemptions_per_h']:.1f} per hour), largest burst {s['largest_burst']} at once",
             "hour  mean live  preemptions"]
    lines += [f"{b['start_h']:4.0f}  {b['mean_live']:9.1f}  {b['preemptions']:11d}" for b in s["per_bucket"]]
    return "\n".join(lines)


def plot_trace(trace, path: str | Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    points = trace.live_over_time()
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(9, 5), sharex=True)
    top.step([p[0] / 3600 for p in points], [p[1] for p in points], where="post")
    top.set_ylabel("live nodes")
    removes = [e.t_s / 3600 for e in trace.events if e.action == "remove"]
    hours = max(1, int(trace.duration_s // 3600) + 1)
    bottom.hist(removes, bins=hours, range=(0, hours))
    bottom.set_ylabel("preemptions per hour")
    bottom.set_xlabel("hours")
    top.set_title(trace.source)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
