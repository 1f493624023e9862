"""What `spotlight simulate` and `spotlight traces show` print and plot: a terminal table and a
matplotlib figure (Agg backend: no display needed)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

COLUMNS = (("time_to_target_h", "hours to target", "{:.2f}"), ("cost_usd", "cost $", "{:,.0f}"),
           ("gpu_utilization", "GPU util", "{:.0%}"), ("preemptions", "preemptions", "{}"),
           ("steps_recomputed", "steps redone", "{}"), ("iterations_to_target", "iterations", "{}"),
           ("final_score", "final score", "{:.3f}"), ("total_cost_usd", "spent $", "{:,.0f}"),
           ("stop_reason", "stopped at", "{}"))


def table(result: dict[str, Any]) -> str:
    """One row per policy, with speed-up and cost ratio against `ondemand` when it was simulated."""
    pols = result["policies"]
    base = pols.get("ondemand")
    head = ["policy"] + [c[1] for c in COLUMNS] + (["speed-up", "cost ratio"] if base else [])
    rows = [head]
    for name, r in pols.items():
        cells = [name] + ["-" if r.get(k) is None else fmt.format(r[k]) for k, _, fmt in COLUMNS]
        if base:
            ok = r["time_to_target_h"] and base["time_to_target_h"]
            cells += [f"{base['time_to_target_h'] / r['time_to_target_h']:.2f}x" if ok else "-",
                      f"{base['cost_usd'] / r['cost_usd']:.2f}x" if ok else "-"]
        rows.append(cells)
    widths = [max(len(row[i]) for row in rows) for i in range(len(head))]
    lines = ["  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths))) for row in rows]
    c = result["config"]
    lines.append(f"({c['gpus']} on-demand + up to {c['spot_gpus_peak']} spot {c['gpu']} GPUs at "
                 f"${c['price_per_gpu_h']['ondemand']:.2f} / ${c['price_per_gpu_h']['spot']:.2f} per GPU-hour, "
                 f"{c['resolution']}px, {c['prompts']}x{c['group_size']} samples per iteration; trace {result['trace']}; "
                 f"speed-up and cost ratio vs ondemand)")
    return "\n".join(lines)


def plot_simulation(result: dict[str, Any], path: str | Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (top, bottom) = plt.subplots(2, 1, figsize=(9, 7), sharex=True)
    for name, r in result["policies"].items():
        t = [p[0] for p in r["timeline"]]
        top.step(t, [p[1] for p in r["timeline"]], where="post", label=name)
        bottom.plot([p[0] for p in r["progress"]], [p[1] for p in r["progress"]], label=name)
    bottom.axhline(result["progress_model"]["target"], color="grey", ls="--", lw=1, label="target")
    top.set_ylabel("live GPUs (paid)")
    bottom.set_ylabel("validation score (model)")
    bottom.set_xlabel("hours")
    top.legend(fontsize=8)
    bottom.legend(fontsize=8)
    top.set_title(f"trace {result['trace']}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def trace_table(summary: dict[str, Any]) -> str:
    s = summary
    lines = [f"{s['source']}: {s['events']} events, {s['nodes']} distinct nodes over {s['duration_h']:.1f} h; "
             f"live nodes max {s['max_live']}, mean {s['mean_live']:.1f}; {s['preemptions']} preemptions "
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
