import json as _json
import re
from pathlib import Path

import pytest

from schedulers.trace_synth import SynthSpec, open_trace, synthesize, write_bamboo
from schedulers.traces import ReplayAction, Trace, TraceError, TraceEvent, load_trace, replay_schedule, summarize

TRACES = Path(__file__).resolve().parents[2] / "experiments" / "traces"  # copies of shared/data/traces


def write(tmp_path: Path, text: str, name: str = "trace.csv") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def handmade() -> Trace:
    """a, c share slot 0 and b, d slot 1 on 2 slots; a joins again at the end."""
    rows = [(0, "add", "a"), (0, "add", "b"), (0, "add", "c"), (100, "remove", "a"), (130, "remove", "b"),
            (200, "add", "d"), (220, "remove", "d"), (300, "remove", "c"), (310, "add", "a")]
    return Trace([TraceEvent(t, action, node) for t, action, node in rows], "handmade")


@pytest.mark.parametrize(
    "name, events, hours, max_live", [("bamboo-p3.csv", 344, 11.4, 32), ("bamboo-g4dn.csv", 153, 10.8, 24)]
)
def test_shipped_bamboo_traces_load(name, events, hours, max_live):
    trace = load_trace(TRACES / name)
    assert len(trace.events) == events
    assert round(trace.duration_s / 3600, 1) == hours
    assert trace.max_live == max_live
    assert trace.source == str(TRACES / name)
    assert trace.preemptions == sum(e.action == "remove" for e in trace.events) > 0
    for slots in (1, 2, 4):
        kills = [a for a in replay_schedule(trace, slots) if a.action == "kill"]
        assert len(kills) == trace.preemptions  # every preemption burst is felt on any slot count


@pytest.mark.parametrize("name", ["bamboo-gcloud-a100x1-east1b.txt", "bamboo-gcloud-v100x1-east1c.txt"])
def test_shipped_gcloud_traces_load(name):
    trace = load_trace(TRACES / name)
    assert trace.max_live == max(int(line.rsplit(",", 1)[1]) for line in (TRACES / name).read_text().splitlines())
    assert trace.duration_s > 20 * 3600 and trace.preemptions > 0
    assert all(node.startswith("gcp-") for node in trace.nodes)


def test_trace_properties():
    trace = handmade()
    assert trace.nodes == ["a", "b", "c", "d"]
    assert trace.preemptions == 4 and trace.duration_s == 310 and trace.max_live == 3
    assert trace.live_over_time() == [(0, 3), (100, 2), (130, 1), (200, 2), (220, 1), (300, 0), (310, 1)]
    assert Trace([], "empty").duration_s == 0 and Trace([], "empty").max_live == 0


def test_gcp_counts_become_add_and_remove_events(tmp_path):
    # The fourth line repeats the current count but starts early (as the shipped files do): ignored.
    text = """2021-12-11, 23:59:00, 2
2021-12-11, 23:59:30, 2
2021-12-12, 00:01:00, 3
2021-12-12, 00:00:30, 3
2021-12-12, 00:04:00, 1
2021-12-12, 00:05:00, 1
"""
    path = write(tmp_path, text, "counts.txt")
    trace = load_trace(path)
    assert trace.events == [
        TraceEvent(0, "add", "gcp-1"), TraceEvent(0, "add", "gcp-2"), TraceEvent(120, "add", "gcp-3"),
        TraceEvent(300, "remove", "gcp-3"), TraceEvent(300, "remove", "gcp-2"),
    ]
    assert trace.duration_s == 360 and trace.max_live == 3 and trace.preemptions == 2


BAMBOO_CASES = [
    ("0,add,node1\n480000,add\n", 2, "2 fields"),
    ("0,add,node1\nsoon,add,node2\n", 2, "time 'soon' is not a number"),
    ("0,add,node1\n10,join,node2\n", 2, "unknown event 'join'"),
    ("0,add,node1\n5000,add,node2\n\n4000,remove,node1\n", 4, "time goes backwards"),
    ("0,add,node1\n10,remove,node2\n", 2, "node2 is removed but is not live"),
    ("0,add,node1\n10,add,node1\n", 2, "node1 is added but is already live"),
    ("-5,add,node1\n", 1, "time -5 ms is not a finite time >= 0"),
]
GCP_CASES = [
    ("2021-12-11, 11:11:30, 55\n2021-12-11, 11:13:10, lots\n", 2, "count 'lots' is not an integer"),
    ("2021-12-11, 11:11:30, 55\n2021-12-11, 11:13:10\n", 2, "2 fields"),
    ("2021-12-11, 11:11:30, 55\n2021-12-11, 25:13:10, 54\n", 2, "bad date/time"),
    ("2021-12-11, 11:11:30, 55\n2021-12-11, 11:15:00, 50\n2021-12-11, 11:14:00, 49\n", 3, "time goes backwards"),
    ("2021-12-11, 11:11:30, 55\n2021-12-11, 11:15:00, -1\n", 2, "count -1 is negative"),
]


@pytest.mark.parametrize("text, line, what", BAMBOO_CASES + GCP_CASES)
def test_malformed_lines_name_file_and_line(tmp_path, text, line, what):
    path = write(tmp_path, text)
    with pytest.raises(TraceError) as error:
        load_trace(path)
    message = str(error.value)
    assert "\n" not in message
    assert message.startswith(f"{path}:{line}: {what}")
    assert "(expected " in message


def test_missing_and_empty_files(tmp_path):
    with pytest.raises(TraceError, match=r"nope\.csv: no such trace file$"):
        load_trace(tmp_path / "nope.csv")
    for text in ("", "\n  \n"):
        with pytest.raises(TraceError) as error:
            load_trace(write(tmp_path, text))
        assert str(error.value).startswith(f"{tmp_path / 'trace.csv'}: empty trace file (expected ")


def test_trace_built_by_hand_is_validated():
    with pytest.raises(TraceError, match=r"^hand: event 2: x is added but is already live"):
        Trace([TraceEvent(0, "add", "x"), TraceEvent(1, "add", "x")], "hand")
    with pytest.raises(TraceError, match=r"^hand: event 2: time goes backwards"):
        Trace([TraceEvent(5, "add", "x"), TraceEvent(1, "add", "y")], "hand")


def test_replay_schedule_handmade():
    actions = [(a.at_s, a.slot, a.action) for a in replay_schedule(handmade(), slots=2, speedup=2.0, notice_s=60)]
    assert actions == [
        (0, 0, "add"), (0, 1, "add"),  # initial fleet: c joins slot 0, already alive
        (20, 0, "notice"),  # a leaves at 100: notice at (100 - 60) / 2
        (35, 1, "notice"),  # b leaves at 130
        (50, 0, "kill"), (50, 0, "add"),  # c keeps slot 0 alive: replacement joins at once
        (65, 1, "kill"),  # slot 1 is now dead
        (100, 1, "add"),  # d revives slot 1 at 200 ...
        (100, 1, "notice"),  # ... and leaves at 220: no notice before it joined (max(160, 200) / 2)
        (110, 1, "kill"),
        (120, 0, "notice"), (150, 0, "kill"),  # c, the last node of slot 0
        (155, 0, "add"),  # a joins again on its old slot
    ]
    assert all(isinstance(a, ReplayAction) for a in replay_schedule(handmade(), 2))


def test_replay_schedule_without_notice_and_on_one_slot():
    actions = [(a.at_s, a.slot, a.action) for a in replay_schedule(handmade(), slots=1, notice_s=0)]
    assert actions == [
        (0, 0, "add"), (100, 0, "kill"), (100, 0, "add"), (130, 0, "kill"), (130, 0, "add"),
        (220, 0, "kill"), (220, 0, "add"), (300, 0, "kill"), (310, 0, "add"),
    ]
    with pytest.raises(ValueError, match="slots"):
        replay_schedule(handmade(), slots=0)
    with pytest.raises(ValueError, match="speedup"):
        replay_schedule(handmade(), slots=1, speedup=0)


def test_replay_bamboo_p3_on_two_slots():
    trace = load_trace(TRACES / "bamboo-p3.csv")
    actions = replay_schedule(trace, slots=2, speedup=60.0)
    assert sum(a.action == "kill" for a in actions) == trace.preemptions == 167
    assert sum(a.action == "notice" for a in actions) == trace.preemptions
    assert [a.at_s for a in actions] == sorted(a.at_s for a in actions)
    assert {a.slot for a in actions} == {0, 1}
    assert actions[-1].at_s == pytest.approx(trace.duration_s / 60.0)


# -- SkyPilot JSON, counts CSV, synthetic traces, summaries --------------------------------------------



def test_skypilot_single_node_json_reads_1_as_available(tmp_path):
    # as published in skypilot-org/spot-traces (schedulers/traces.py says how this was checked)
    path = write(tmp_path, _json.dumps({"metadata": {"gap_seconds": 60}, "data": [1, 1, 0, 0, 1]}), "sky.json")
    trace = load_trace(path)
    assert [(e.t_s, e.action, e.node) for e in trace.events] == [(0, "add", "sky-1"), (120, "remove", "sky-1"),
                                                                   (240, "add", "sky-2")]
    assert trace.duration_s == 300
    # the Can't Be Late simulator's own files say 1 = preempted: metadata.one_means flips it
    flipped = write(tmp_path, _json.dumps({"metadata": {"gap_seconds": 60, "one_means": "preempted"},
                                           "data": [0, 0, 1, 1, 0]}), "sky1.json")
    assert [(e.t_s, e.action) for e in load_trace(flipped).events] == [(0, "add"), (120, "remove"), (240, "add")]
    per_instance = write(tmp_path, _json.dumps({"metadata": {"gap_seconds": 60}, "data": [[1, 0], [0, 1]]}), "sky2.json")
    t2 = load_trace(per_instance)
    assert [(e.t_s, e.action, e.node) for e in t2.events] == [(0, "add", "sky-0"), (60, "remove", "sky-0"),
                                                               (60, "add", "sky-1")]


def test_skypilot_multi_node_json_is_a_count_trace(tmp_path):
    # the layout of availability/16-node/*.json: one count of available instances per 300 s tick
    doc = {"metadata": {"gap_seconds": 300}, "data": [0, 5, 16, 16, 8, 0, 3, 3, 16]}
    trace = load_trace(write(tmp_path, _json.dumps(doc), "us-west-2a_v100_1.json"))
    assert trace.live_over_time() == [(300, 5), (600, 16), (1200, 8), (1500, 0), (1800, 3), (2400, 16)]
    assert trace.max_live == 16 and trace.duration_s == 9 * 300
    assert trace.preemptions == 8 + 8 and len(trace.nodes) == 16 + 3 + 13  # a drop removes the newest
    assert summarize(trace)["mean_live"] == pytest.approx((5 + 16 * 2 + 8 + 3 * 2 + 16) / 9)


@pytest.mark.parametrize("doc, what", [
    ({"metadata": {"gap_seconds": 0}, "data": [0]}, "metadata.gap_seconds"),
    ({"metadata": {"gap_seconds": 10}, "data": [0, -2]}, "data[1]: -2 is negative (expected "),
    ({"metadata": {"gap_seconds": 10}, "data": [0, 2.5]}, "data[1]: 2.5 is not an integer (expected "),
    ({"metadata": {"gap_seconds": 10}, "data": [3.0]}, "data[0]: 3.0 is not an integer"),
    ({"metadata": {"gap_seconds": 10}, "data": [1, True]}, "data[1]: True is not an integer"),
    ({"metadata": {"gap_seconds": 10}, "data": [1, "3"]}, "data[1]: '3' is not an integer"),
    ({"metadata": {"gap_seconds": 10}, "data": [1, 10 ** 30]}, "data[1]: 1000000000000000000000000000000 is more than "
                                                                "65,536 instances"),
    ({"metadata": {"gap_seconds": 10, "one_means": "preempted"}, "data": [0, 2]}, "data[1]: 2 is not 0 or 1"),
    ({"metadata": {"gap_seconds": 10, "one_means": "maybe"}, "data": [0]}, "metadata.one_means"),
    ({"metadata": {"gap_seconds": 10}, "data": [[0, 2], [0, 1]]}, "data[0][1]: 2 is not 0 or 1"),
    ({"metadata": {"gap_seconds": 10}, "data": [[0, 1], [0]]}, "differ in length"),
    ({"metadata": {"gap_seconds": 10}, "data": []}, "data: expected a non-empty list"),
    ({"data": [0]}, "metadata and data"),
])
def test_skypilot_json_errors_name_the_file_and_item(tmp_path, doc, what):
    path = write(tmp_path, _json.dumps(doc), "bad.json")
    with pytest.raises(TraceError, match=re.escape(what)) as err:
        load_trace(path)
    assert str(err.value).startswith(f"{path}: ") and "\n" not in str(err.value) and len(str(err.value)) < 300
    syntax = write(tmp_path, '{"metadata":\n  {"gap_seconds": 1},\n  "data": [0,]\n}', "syntax.json")
    with pytest.raises(TraceError, match=rf"{syntax}:3: not JSON"):
        load_trace(syntax)


def test_skypilot_counts_are_bounded_before_events_are_made(tmp_path):
    # 60,000 then 0 then 60,000: 180,000 events in 40 bytes would pass MAX_EVENTS only in bulk; a count
    # that asks for more distinct nodes than MAX_NODES fails at the tick that does
    doc = {"metadata": {"gap_seconds": 10}, "data": [60000, 0, 60000]}
    with pytest.raises(TraceError, match=r"data\[2\]: more than 65,536 distinct nodes"):
        load_trace(write(tmp_path, _json.dumps(doc), "big.json"))


def test_counts_csv_and_its_errors(tmp_path):
    trace = load_trace(write(tmp_path, "t_s,nodes\n0,2\n60,3\n120,1\n"))
    assert trace.live_over_time() == [(0, 2), (60, 3), (120, 1)] and trace.preemptions == 2
    for text, line, what in [("t_s,nodes\n0,2\n60,x\n", 3, "not seconds,count"),
                             ("t_s,nodes\n0,2\n-5,1\n", 3, "finite time"),
                             ("t_s,nodes\n10,2\n5,1\n", 3, "backwards"),
                             ("t_s,nodes\n0,2,3\n", 2, "3 fields")]:
        path = write(tmp_path, text, "c.csv")
        with pytest.raises(TraceError, match=rf"^{path}:{line}: .*{what}"):
            load_trace(path)


def test_synthetic_traces_are_seeded_valid_and_round_trip(tmp_path):
    spec = "synth:poisson?nodes=16&rate_h=20&burst_rate_h=1&burst_size=6&return_s=600&hours=6&seed=4"
    a, b = open_trace(spec), open_trace(spec)
    assert a.events == b.events and a.max_live == 16 and a.preemptions > 60
    assert summarize(a)["largest_burst"] >= 6 or a.preemptions == 0
    assert open_trace(spec.replace("seed=4", "seed=5")).events != a.events
    never_back = synthesize(SynthSpec(nodes=8, rate_h=10, burst_rate_h=0, return_s=0, hours=5, seed=1))
    assert all(e.action == "remove" for e in never_back.events[8:])
    path = tmp_path / "synth.csv"
    write_bamboo(a, path)
    again = load_trace(path)
    assert [(round(e.t_s, 3), e.action, e.node) for e in again.events] == [(round(e.t_s, 3), e.action, e.node)
                                                                         for e in a.events]
    with pytest.raises(TraceError, match="burst_size"):
        open_trace("synth:poisson?burst_size=0")


def test_summary_of_a_shipped_trace():
    s = summarize(load_trace(TRACES / "bamboo-p3.csv"))
    assert s["preemptions"] == 167 and s["max_live"] == 32 and len(s["per_bucket"]) == 12
    assert sum(b["preemptions"] for b in s["per_bucket"]) == 167
    assert 20 < s["mean_live"] < 32


def test_traces_cli_show_and_synth(tmp_path, capsys):
    from spotlight import cli

    png = tmp_path / "t.png"
    assert cli.main(["traces", "show", str(TRACES / "bamboo-g4dn.csv"), "--plot", str(png)]) == 0
    assert "preemptions" in capsys.readouterr().out and png.stat().st_size > 5000
    out = tmp_path / "s.csv"
    assert cli.main(["traces", "synth", "synth:poisson?hours=2&seed=1", "--out", str(out)]) == 0
    capsys.readouterr()
    assert cli.main(["traces", "show", str(out), "--json"]) == 0
    assert _json.loads(capsys.readouterr().out)["max_live"] == 32
