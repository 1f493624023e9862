"""What `spotlight simulate` and `spotlight traces show` print and plot: a terminal table and a
matplotlib figure (Agg backend: no display needed)."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

from spotlight.sim.config import POLICIES
from spotlight.text import plural

WIDTH = 100
"""The terminal output's width at most: a table too wide is printed in blocks of columns, each
under the policy names (as pandas prints a wide frame), and prose is wrapped. One row of every
column ran to 225 characters (issue 42)."""

ANSWER = (("time_to_target_h", "hours to target", "{:.2f}"), ("cost_usd", "cost $", "{:,.0f}"))
"""The columns a buyer reads first, before the comparisons with the baselines."""
COLUMNS = (("gpu_utilization", "GPU util", "{:.0%}"), ("preemptions", "preemptions", "{}"),
           ("steps_recomputed", "steps redone", "{}"), ("iterations_to_target", "iterations", "{}"),
           ("final_score", "final score", "{:.3f}"), ("total_cost_usd", "spent $", "{:,.0f}"),
           ("stop_reason", "stopped at", "{}"))
"""The columns after the comparisons."""


def columns(rows: list[list[str]], width: int = WIDTH) -> list[str]:
    """`rows` (the first the header) as aligned text no wider than `width` where the columns allow:
    the first column left-aligned, the others right-aligned, two spaces apart; columns that do not
    fit go to a further block (after an empty line) that repeats the first column."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    blocks, block = [], [0]
    for i in range(1, len(widths)):
        if len(block) > 1 and sum(widths[j] + 2 for j in block) + widths[i] > width:
            blocks.append(block)
            block = [0]
        block.append(i)
    blocks.append(block)
    lines: list[str] = []
    for b in blocks:
        lines += [""] if lines else []
        lines += ["  ".join(row[i].ljust(widths[i]) if i == 0 else row[i].rjust(widths[i]) for i in b).rstrip()
                  for row in rows]
    return lines


def wrapped(text: str, width: int = WIDTH) -> list[str]:
    """A line of prose as lines of at most `width` characters (the continuations indented)."""
    return textwrap.wrap(text, width, subsequent_indent="  ", break_on_hyphens=False) or [""]


def _vs_ondemand(ratio: float) -> str:
    """A policy's cost over ondemand's, said both ways: "0.59x (41% less)", "1.70x (70% more)"."""
    if abs(ratio - 1.0) < 0.005:
        return f"{ratio:.2f}x (same)"
    return f"{ratio:.2f}x ({abs(ratio - 1.0):.0%} {'less' if ratio < 1.0 else 'more'})"


TABLE_BASELINES = ("ondemand", "ondemand_total")
"""The baselines the terminal table compares with (all four are in `--json`): on-demand GRPO on
the same on-demand GPUs, and on as many GPUs in all, every one on-demand."""


VERDICT_POLICY = "spotlight"
"""The policy the summary line under the table and the plot's verdict speak of, when simulated."""


def _headline(result: dict[str, Any]) -> tuple[str, str, dict[str, Any]] | None:
    """(policy, baseline, its result): `VERDICT_POLICY` against the first of `TABLE_BASELINES` it
    was compared with, else the first baseline its result has a `speedup_vs_*` for; None if neither."""
    r = result["policies"].get(VERDICT_POLICY)
    if r is None:
        return None
    compared = [k[len("speedup_vs_"):] for k in r if k.startswith("speedup_vs_") and k != f"speedup_vs_{VERDICT_POLICY}"]
    base = next((b for b in TABLE_BASELINES if b in compared), compared[0] if compared else None)
    return None if base is None else (VERDICT_POLICY, base, r)


def first_to_target(result: dict[str, Any]) -> str | None:
    """The policy that reaches the target soonest (the oracle, which knows the trace, left out;
    ties: the cheaper, then the first simulated); None when none does."""
    reached = [(r["time_to_target_h"], r["cost_usd"] if r.get("cost_usd") is not None else float("inf"), i, name)
               for i, (name, r) in enumerate(result["policies"].items())
               if r.get("time_to_target_h") is not None and not _oracle(name)]
    return min(reached)[3] if reached else None


def frontier(result: dict[str, Any]) -> list[str]:
    """The policies that reached the target that no other reached both sooner and cheaper (the
    oracle left out), by hours to target: what a buyer chooses among."""
    points = {name: (r["time_to_target_h"], r["cost_usd"]) for name, r in result["policies"].items()
              if r.get("time_to_target_h") is not None and r.get("cost_usd") is not None and not _oracle(name)}
    front = [name for name, (t, c) in points.items()
             if not any(t2 <= t and c2 <= c and (t2, c2) != (t, c) for t2, c2 in points.values())]
    return sorted(front, key=lambda name: points[name])


def _oracle(name: str) -> bool:
    return name in POLICIES and POLICIES[name].oracle


def _first_line(result: dict[str, Any], policy: str) -> str:
    """"; ondemand_total reaches it first (0.04 h, $4 against 0.06 h, $3)" where another policy
    than `policy` reaches the target first; "" otherwise."""
    first = first_to_target(result)
    if first is None or first == policy:
        return ""
    pols = result["policies"]
    a, b = pols[first], pols[policy]
    theirs = f"{a['time_to_target_h']:.2f} h, {_usd(a['cost_usd'])}"
    ours = ("it does not reach it" if b.get("time_to_target_h") is None
            else f"against {b['time_to_target_h']:.2f} h, {_usd(b['cost_usd'])}")
    return f"; {first} reaches it first ({theirs} {ours})"


def _span(result: dict[str, Any], policy: str, field: str) -> str:
    """The lowest and highest value of `field` over the constant sets (`result["ranges"]`), as
    "2.40-3.90x"; "" with one set, or where both ends print the same."""
    from spotlight.sim.assumptions import span

    ends = span(result.get("ranges", {}).get(policy, {}).get(field, {}))
    if ends is None or f"{ends[0]:.2f}" == f"{ends[1]:.2f}":
        return ""
    return f"{ends[0]:.2f}-{ends[1]:.2f}x"


def summary(result: dict[str, Any]) -> str | None:
    """The line under the table: "spotlight: 3.36x sooner than ondemand (2.40-3.90x over the
    pessimistic-to-optimistic constants), 0.81x its cost (0.65-1.13x)"; None without a headline."""
    head = _headline(result)
    if head is None:
        return None
    policy, base, r = head
    speedup, ratio = r.get(f"speedup_vs_{base}"), r.get(f"cost_ratio_vs_{base}")
    if speedup is None:
        missed = [n for n in (policy, base) if result["policies"][n]["time_to_target_h"] is None]
        return (f"{policy}: no comparison with {base}: {' and '.join(missed)} did not reach the target"
                + _first_line(result, policy))
    s_span, c_span = _span(result, policy, f"speedup_vs_{base}"), _span(result, policy, f"cost_ratio_vs_{base}")
    line = f"{policy}: {speedup:.2f}x {'sooner than' if speedup >= 1 else 'the speed of'} {base}"
    line += f" ({s_span} over the pessimistic-to-optimistic constants)" if s_span else ""
    line += "" if ratio is None else f", {ratio:.2f}x its cost" + (f" ({c_span})" if c_span else "")
    return line + _first_line(result, policy)


def verdict(result: dict[str, Any]) -> str | None:
    """The plot's headline: "spotlight reaches the target 3.36x sooner than ondemand at 0.81x its
    cost (2.40-3.90x and 0.65-1.13x over the constant sets)", and which policy reaches it first
    where another does ("; ondemand_total reaches it first (1.50 h, $827 against 2.45 h, $739)");
    None without a headline."""
    head = _headline(result)
    if head is None:
        return None
    policy, base, r = head
    speedup, ratio = r.get(f"speedup_vs_{base}"), r.get(f"cost_ratio_vs_{base}")
    if speedup is None:
        return summary(result)
    line = f"{policy} reaches the target {speedup:.2f}x {'sooner than' if speedup >= 1 else 'the speed of'} {base}"
    line += "" if ratio is None else f" at {ratio:.2f}x its cost"
    spans = [x for x in (_span(result, policy, f"speedup_vs_{base}"), _span(result, policy, f"cost_ratio_vs_{base}")) if x]
    return line + (f" ({' and '.join(spans)} over the constant sets)" if spans else "") + _first_line(result, policy)


def table(result: dict[str, Any]) -> str:
    """One row per policy — its hours and dollars to the target, its speed-up and its cost against
    each of `TABLE_BASELINES` that was simulated (the `speedup_vs_*` / `cost_ratio_vs_*` fields:
    above 1x is sooner, below 1x cheaper, with the cost difference in words so that neither reads
    backwards), then the rest — in blocks of columns no wider than `WIDTH`, the lines under it
    wrapped to it."""
    pols = result["policies"]
    bases = [b for b in TABLE_BASELINES if b in pols]
    head = (["policy"] + [c[1] for c in ANSWER] + [h for b in bases for h in (f"speed-up vs {b}", f"cost vs {b}")]
            + [c[1] for c in COLUMNS])
    rows = [head]
    for name, r in pols.items():
        cells = [name] + ["-" if r.get(k) is None else fmt.format(r[k]) for k, _, fmt in ANSWER]
        for b in bases:
            speedup, cost = r.get(f"speedup_vs_{b}"), r.get(f"cost_ratio_vs_{b}")
            cells += ["-" if speedup is None else f"{speedup:.2f}x", "-" if cost is None else _vs_ondemand(cost)]
        rows.append(cells + ["-" if r.get(k) is None else fmt.format(r[k]) for k, _, fmt in COLUMNS])
    lines = columns(rows)
    headline = summary(result)
    if headline:
        lines += wrapped(headline)
    c = result["config"]
    lines += wrapped(f"({c['gpus']} on-demand + up to {c['spot_gpus_peak']} spot {c['gpu']} GPUs at "
                     f"${c['price_per_gpu_h']['ondemand']:.2f} / ${c['price_per_gpu_h']['spot']:.2f} per GPU-hour "
                     f"({c['price_per_gpu_h']['priced_from']}: {c['price_source']}), "
                     f"{c['resolution']}px, {c['prompts']}x{c['group_size']} samples per iteration; trace {result['trace']})")
    if bases:
        defined = {"ondemand": f"ondemand: {c['gpus']} on-demand GPUs",
                   "ondemand_total": f"ondemand_total: {c['ondemand_total_gpus']} on-demand GPUs "
                                     f"({c['gpus']} + the spot fleet's peak)"}
        lines += wrapped("(speed-up: the baseline's hours to target / the policy's, above 1x is sooner; cost: the "
                         "policy's dollars to target / the baseline's, below 1x is cheaper; "
                         + "; ".join(defined[b] for b in bases)
                         + "; --json also compares with spot_restart and sync_explore when they were simulated)")
    return "\n".join(lines)


def _usd(x: float) -> str:
    """Dollars as the tables print them: whole dollars from $100 on, cents below."""
    return f"${x:,.0f}" if abs(x) >= 100 else f"${x:,.2f}"


def price_range_table(result: dict[str, Any]) -> str | None:
    """Every policy's dollars to the target at each row of `result["price_range"]` (its cost ratio
    against `ondemand` in brackets where ondemand was simulated), one column per row, and under it
    each row: provider, instance type, region, spot/on-demand ratio, prices, basis, source, date.
    None when the range is the run's own row alone (the table above says it all)."""
    pr = result.get("price_range")
    if not pr or (len(pr["rows"]) == 1 and pr["rows"][0]["runs_own_row"]):
        return None
    rows = pr["rows"]
    how = ("re-priced from each policy's on-demand and spot GPU-hours (no decision reads a price)"
           if pr["how"] == "repriced" else f"each row simulated again: {pr['why_simulated']}")
    lines = wrapped(f"dollars to the target over the price rows (--price-rows {pr['spec']}; typical constants; {how}):")
    head = ["policy"] + [f"[{i}] {r['ratio']:.2f}x" if r["ratio"] is not None else f"[{i}]"
                         for i, r in enumerate(rows, 1)]
    cells = [head]
    for name, by_row in pr["policies"].items():
        row_cells = [name]
        for r in rows:
            got = by_row[r["name"]]
            if got["cost_usd"] is None:
                row_cells.append("-")
                continue
            ratio = got.get("cost_ratio_vs_ondemand")
            row_cells.append(_usd(got["cost_usd"]) + ("" if ratio is None else f" ({ratio:.2f}x)"))
        cells.append(row_cells)
    lines += columns(cells)
    for i, r in enumerate(rows, 1):
        ratio = "" if r["ratio"] is None else f"spot {r['ratio']:.2f}x on-demand, "
        lines += wrapped(f"[{i}] {r['name']}: {ratio}${r['spot_usd_h']:,.2f} / ${r['ondemand_usd_h']:,.2f} per "
                         f"{r['gpus']}-GPU node-hour; on-demand basis: {r['ondemand_basis']}; source: {r['source']}; "
                         f"{r['date']}")
    lines += wrapped("(the cost ratio in brackets: the policy's dollars to the target / ondemand's at the same row)")
    return "\n".join(lines)


def _dollars_per_hour(x: float) -> str:
    return f"{'-' if x < 0 else ''}${abs(x):,.2f}"


def _spread(values: dict[str, float | None], what: str) -> str:
    """"$4.10 to $8.00 over the constant sets" over the non-null values; "" with fewer than two."""
    got = [v for v in values.values() if v is not None]
    if len(got) < 2:
        return ""
    lo, hi = min(got), max(got)
    span = _dollars_per_hour(lo) if f"{lo:.2f}" == f"{hi:.2f}" else f"{_dollars_per_hour(lo)} to {_dollars_per_hour(hi)}"
    missing = len(values) - len(got)
    return f"{span} over the {what}" + (f" ({missing} null)" if missing else "")


def hour_saved_lines(result: dict[str, Any]) -> list[str]:
    """One line (wrapped to `WIDTH`) per baseline of `result["price_of_an_hour_saved"]`: what an hour sooner costs at the
    typical constants, with the spread over the constant sets and over the price rows, or why there
    is none (not sooner, a target not reached); nothing for a baseline not simulated (`--json` says so)."""
    h = result.get("price_of_an_hour_saved")
    if not h or h.get("policy") is None:
        return []
    policy, lines = h["policy"], []
    for key in (k for k in h if k.startswith("usd_per_hour_sooner_vs_")):
        base = key[len("usd_per_hour_sooner_vs_"):]
        values, why = h[key], h[f"why_null_vs_{base}"]
        if values is None:  # not simulated: the user did not ask for it
            continue
        typical = values["by_constant_set"].get("typical")
        spreads = [x for x in (_spread(values["by_constant_set"], "constant sets"),
                               _spread(values["by_price_row"], "price rows")) if x]
        tail = f" ({'; '.join(spreads)})" if spreads else ""
        if typical is None:
            lines.append("\n".join(wrapped(f"{policy} vs {base}: no price of an hour saved at the typical "
                                            f"constants: {why['by_constant_set'].get('typical', '')}{tail}")))
            continue
        note = " (sooner and cheaper)" if typical < 0 else ""
        lines.append("\n".join(wrapped(f"{policy}: {_dollars_per_hour(typical)} per hour sooner than {base}{note}, "
                                        f"at the typical constants and the run's prices{tail}")))
    return lines


def plot_simulation(result: dict[str, Any], path: str | Path) -> Any:
    """What a buyer needs, in one figure under its headline (`verdict`): first the answer — each
    policy's hours and dollars to the target, one labelled point each, the frontier (`frontier`:
    no other policy both sooner and cheaper) joined and ringed — then, on the hours of the runs
    (to the longest run's end, not the trace's), the modelled validation score with the target,
    the dollars spent so far (`cumulative_cost`) and the live (paid) GPUs, each policy in its own
    colour, line style and marker (one legend, beside the panels, for all three), its time to
    target marked on the first two. The trace's preemptions during the runs are ticks along the
    bottom of the three; the oracle's lines end when its run ends. Every text lies inside the
    figure (a long trace name is wrapped). Returns the (closed) figure, for a test to read."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pols = result["policies"]
    end_h = max((r["wall_h"] for r in pols.values()), default=0.0) or 1.0
    fig = plt.figure(figsize=(11, 12.5), layout="constrained")
    grid = fig.add_gridspec(4, 1, height_ratios=[2.6, 2.0, 2.0, 1.3])
    answer = fig.add_subplot(grid[0])
    score = fig.add_subplot(grid[1])
    cost = fig.add_subplot(grid[2], sharex=score)
    gpus = fig.add_subplot(grid[3], sharex=score)
    styles = ["-", "--", "-.", ":"]
    markers = ["o", "s", "^", "D", "v", "P", "X", "*"]
    looks = {}
    for i, (name, r) in enumerate(pols.items()):
        look = looks[name] = dict(color=f"C{i % 10}", ls=styles[i % len(styles)], lw=1.4)
        prog = r["progress"]
        score.plot([p[0] for p in prog], [p[1] for p in prog], marker=markers[i % len(markers)],
                   markevery=max(1, len(prog) // 12), ms=4, label=name, **look)
        spent = cumulative_cost(r, result["config"])
        cost.plot([p[0] for p in spent], [p[1] for p in spent], label=name, **look)
        if r.get("time_to_target_h") is not None:
            score.plot(r["time_to_target_h"], result["progress_model"]["target"], "o", color=look["color"], ms=7)
            cost.plot(r["time_to_target_h"], r["cost_usd"], "o", color=look["color"], ms=7)
        live = _until(r["timeline"], r["wall_h"])
        gpus.step([p[0] for p in live], [p[1] for p in live], where="post", label=name, **{**look, "lw": 1.0},
                  alpha=0.8)
    _plot_answer(answer, result, looks, markers)
    # The trace's removals during the runs: a tick per instant (a burst is one), counted in the legend.
    preempted = sorted({t for r in pols.values() for t in r.get("preemption_times_h", ()) if t <= end_h})
    removals = max((len(r.get("preemption_times_h", ())) for r in pols.values()), default=0)
    for ax in (score, cost, gpus):
        if preempted:  # along the bottom: x in hours, y in the panel's height
            ax.plot(preempted, [0.0] * len(preempted), "|", color="black", ms=14, mew=1.2, alpha=0.6, clip_on=False,
                    transform=ax.get_xaxis_transform(),
                    label=f"{plural(removals, 'preemption')} in the longest spot run" if ax is gpus else None)
        ax.tick_params(labelsize=8)
    score.axhline(result["progress_model"]["target"], color="grey", ls="--", lw=1, label="target")
    score.set_ylabel("validation score (model)")
    score.set_title("over the hours of the runs (o: the target reached)", fontsize=10)
    cost.set_ylabel("dollars spent")
    gpus.set_ylabel("live GPUs (paid)", fontsize=9)
    gpus.set_ylim(bottom=0)
    if preempted:  # the policies are the figure's legend; this panel's says what the ticks are
        gpus.legend(handles=[h for h in gpus.get_lines() if h.get_label().endswith("spot run")], fontsize=8,
                    loc="lower right")
    gpus.set_xlabel("hours")
    gpus.set_xlim(0, end_h * 1.02)
    handles, labels = score.get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside right center", fontsize=8, title="policy", title_fontsize=8)
    line = verdict(result)
    if line:
        fig.suptitle(_plain("\n".join(textwrap.wrap(line, 110))), fontsize=10)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return fig


def _plot_answer(ax: Any, result: dict[str, Any], looks: dict[str, dict], markers: list[str]) -> None:
    """The buyer's panel: hours to target (x) against dollars to target (y), a point per policy
    that reached it, named; the frontier joined and ringed; the policies that did not reach it said."""
    pols = result["policies"]
    reached = [n for n, r in pols.items() if r.get("time_to_target_h") is not None and r.get("cost_usd") is not None]
    for i, name in enumerate(pols):
        if name in reached:
            ax.plot(pols[name]["time_to_target_h"], pols[name]["cost_usd"], marker=markers[i % len(markers)], ms=8,
                    ls="none", color=looks[name]["color"], label=name)
    front = frontier(result)
    if front:
        xs = [pols[n]["time_to_target_h"] for n in front]
        ys = [pols[n]["cost_usd"] for n in front]
        ax.step(xs, ys, where="post", color="black", lw=1.0, alpha=0.6, zorder=0)
        ax.plot(xs, ys, "o", ms=15, mfc="none", mec="black", mew=1.0, label="frontier")
    # One name per point; policies at the same point share it ("spotlight, spotlight_noexplore").
    at: dict[tuple[float, float], list[str]] = {}
    for n in reached:
        at.setdefault((pols[n]["time_to_target_h"], pols[n]["cost_usd"]), []).append(n)
    xs = [x for x, _ in at] or [0.0]
    middle = (min(xs) + max(xs)) / 2
    for (x, y), names in at.items():
        right = x <= middle  # names point inwards, so none leaves the panel
        ax.annotate(", ".join(names), (x, y), xytext=(9 if right else -9, 6), textcoords="offset points",
                    ha="left" if right else "right", fontsize=8)
    ax.margins(x=0.12, y=0.15)
    missed = [n for n in pols if n not in reached]
    if missed:
        ax.text(0.01, 0.02, "\n".join(textwrap.wrap("did not reach the target: " + ", ".join(missed), 80)),
                transform=ax.transAxes, fontsize=8, va="bottom")
    ax.set_xlabel("hours to target", fontsize=9)
    ax.set_ylabel("dollars to target")
    ax.tick_params(labelsize=8)
    trace = _plain("\n".join(textwrap.wrap(f"trace {result['trace']}", 100)))
    ax.set_title(f"hours and dollars to the target, per policy (ringed: the frontier, none sooner and cheaper)\n"
                 f"{trace}", fontsize=10)


def _plain(text: str) -> str:
    """`text` as matplotlib prints it verbatim: a `$` would start its math mode ("$3.53 against $3.28")."""
    return text.replace("$", r"\$")


def _until(timeline: list, end_h: float) -> list[tuple[float, int]]:
    """A timeline's points up to `end_h`, and one at `end_h`: a run's lines end when the run does
    (the oracle's timeline is the whole trace's)."""
    points = [(t, n) for t, n in timeline if t <= end_h]
    return points + [(end_h, points[-1][1])] if points and points[-1][0] < end_h else points


def cumulative_cost(r: dict[str, Any], config: dict[str, Any]) -> list[tuple[float, float]]:
    """[(hours, dollars spent by then)] of one policy's result, at its timeline's points up to its
    end, from `config["price_per_gpu_h"]`. The timeline counts the paid GPUs, not which are
    on-demand; that count is the one that makes the integral the result's `total_cost_usd`
    (every policy's meter bills its timeline: a constant number of on-demand GPUs, the rest spot),
    so a policy with its own on-demand count (`ondemand_total`, an all-spot baseline) needs no
    rule here."""
    prices = config["price_per_gpu_h"]
    od_h, spot_h = prices["ondemand"], prices["spot"]
    points = _until(r["timeline"], r["wall_h"])
    out, total_gpu_h = [], [0.0]
    for (t0, n), (t1, _) in zip(points, points[1:]):
        total_gpu_h.append(total_gpu_h[-1] + n * (t1 - t0))
    end = r["wall_h"]
    fewest = min((n for _, n in points), default=0)
    if od_h > spot_h and end > 0:
        ondemand = round((r["total_cost_usd"] - spot_h * total_gpu_h[-1]) / ((od_h - spot_h) * end))
        ondemand = max(0, min(ondemand, fewest))
    else:
        ondemand = fewest
    for (t, _), gpu_h in zip(points, total_gpu_h):
        out.append((t, spot_h * gpu_h + (od_h - spot_h) * ondemand * t))
    return out or [(0.0, 0.0)]


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
