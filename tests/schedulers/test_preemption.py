import os
import signal
import threading

import pytest

from schedulers.clock import ManualClock
from schedulers.preemption import Cause, NoticeSource, NoticeWatcher, PreemptionNotice, SigtermSource


class NthPollSource:
    """Answers None until its k-th poll, then `notice` on every poll."""

    def __init__(self, k: int, notice: PreemptionNotice) -> None:
        self.k, self.notice, self.polls = k, notice, 0

    def poll(self) -> PreemptionNotice | None:
        self.polls += 1
        return self.notice if self.polls >= self.k else None


class BrokenSource:
    def poll(self) -> PreemptionNotice | None:
        raise RuntimeError("broken source")


@pytest.fixture
def restore_sigterm():
    before = signal.getsignal(signal.SIGTERM)
    yield
    signal.signal(signal.SIGTERM, before)


def _deliver(watcher: NoticeWatcher, done: threading.Event) -> None:
    watcher.start()
    assert done.wait(10), "no notice delivered"
    watcher.join(10)
    assert not watcher.running


def test_cause_values_and_notice_seconds_left():
    assert Cause("aws-instance-action") is Cause.AWS_INSTANCE_ACTION
    assert [c.value for c in Cause] == ["aws-instance-action", "aws-rebalance", "gcp-preempted", "sigterm", "trace",
                                        "ray-drain"]
    clock = ManualClock(100.0)
    notice = PreemptionNotice(Cause.GCP_PREEMPTED, deadline=130.0)
    assert notice.seconds_left(clock) == 30.0
    clock.advance(45)
    assert notice.seconds_left(clock) == 0.0
    assert PreemptionNotice(Cause.AWS_REBALANCE, None).seconds_left(clock) is None
    with pytest.raises(AttributeError):
        notice.deadline = 1.0  # type: ignore[misc]


def test_sigterm_source_records_notice_and_chains_previous_handler(restore_sigterm):
    seen = []
    signal.signal(signal.SIGTERM, lambda signum, frame: seen.append(signum))
    clock = ManualClock(50.0)
    source = SigtermSource(clock, grace_s=20.0, chain=True)
    assert isinstance(source, NoticeSource)
    assert source.poll() is None
    os.kill(os.getpid(), signal.SIGTERM)
    notice = source.poll()
    assert notice == PreemptionNotice(Cause.SIGTERM, 70.0, detail=notice.detail)
    assert seen == [signal.SIGTERM]
    clock.advance(5)
    os.kill(os.getpid(), signal.SIGTERM)  # a second SIGTERM keeps the first deadline
    assert source.poll().deadline == 70.0 and seen == [signal.SIGTERM] * 2
    source.uninstall()
    assert signal.getsignal(signal.SIGTERM) is not None
    os.kill(os.getpid(), signal.SIGTERM)  # the chained handler is back on its own
    assert seen == [signal.SIGTERM] * 3


def test_sigterm_source_takes_sigterm_over_by_default(restore_sigterm):
    """Ray's worker handler exits at once; a preemption notice must not be cut short by it."""
    seen = []
    signal.signal(signal.SIGTERM, lambda signum, frame: seen.append(signum))
    source = SigtermSource(ManualClock(), grace_s=20.0)
    os.kill(os.getpid(), signal.SIGTERM)
    assert source.poll() is not None and seen == []
    source.uninstall()
    os.kill(os.getpid(), signal.SIGTERM)
    assert seen == [signal.SIGTERM]


def test_sigterm_source_over_default_handler_does_not_exit(restore_sigterm):
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    with SigtermSource(ManualClock(), grace_s=30.0) as source:
        os.kill(os.getpid(), signal.SIGTERM)
        assert source.poll().deadline == 30.0
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL


def test_watcher_reports_kth_poll_once_at_exact_clock_time():
    clock = ManualClock(10.0)
    late = NthPollSource(4, PreemptionNotice(Cause.AWS_INSTANCE_ACTION, 500.0))
    later = NthPollSource(6, PreemptionNotice(Cause.GCP_PREEMPTED, 40.0))
    got, done = [], threading.Event()
    watcher = NoticeWatcher([later, late], lambda n: (got.append((n, clock.now())), done.set()), clock, interval_s=5.0)
    _deliver(watcher, done)
    # polls 1..3 found nothing, each followed by a 5 s sleep; the 4th poll of `late` answers
    assert got == [(late.notice, 25.0)] and watcher.notice == late.notice
    assert (later.polls, late.polls) == (4, 4)


def test_watcher_prefers_the_first_source_in_a_round():
    clock = ManualClock()
    a = NthPollSource(2, PreemptionNotice(Cause.SIGTERM, 30.0))
    b = NthPollSource(2, PreemptionNotice(Cause.AWS_REBALANCE, None))
    got, done = [], threading.Event()
    _deliver(NoticeWatcher([a, b], lambda n: (got.append(n), done.set()), clock, interval_s=1.0), done)
    assert got == [a.notice] and b.polls == 1 and clock.now() == 1.0


def test_watcher_survives_a_source_that_raises():
    clock = ManualClock()
    good = NthPollSource(3, PreemptionNotice(Cause.TRACE, 7.0, node="node3"))
    got, done = [], threading.Event()
    _deliver(NoticeWatcher([BrokenSource(), good], lambda n: (got.append(n), done.set()), clock, 2.0), done)
    assert got == [good.notice] and clock.now() == 4.0


def test_stopped_watcher_never_calls_back():
    clock = ManualClock()
    source = NthPollSource(10**9, PreemptionNotice(Cause.TRACE, None))
    got = []
    watcher = NoticeWatcher([source], got.append, clock, interval_s=1.0).start()
    watcher.stop()
    watcher.join(10)
    assert not watcher.running and got == [] and watcher.notice is None
    with pytest.raises(RuntimeError):
        watcher.start()


def test_watcher_rejects_bad_interval():
    with pytest.raises(ValueError, match="interval_s"):
        NoticeWatcher([], print, ManualClock(), interval_s=0)
