"""Spool bounds, restart resume, and the shipper's outage/replay state machine."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

import pytest

from mycroft.producers.agent.shipper import STATUS_EVERY_S, DoneCallback, Shipper
from mycroft.producers.agent.spool import Entry, Spool


def _e(i: int, size: int = 10) -> Entry:
    return Entry("t", "job", "job", i.to_bytes(4, "little") + b"x" * size)


class FakeTransport:
    """Delivers on poll(); ``up`` False makes every delivery fail; ``hold``
    keeps records in flight (neither delivered nor failed)."""

    def __init__(self) -> None:
        self.up = True
        self.down: str | None = None
        self.hold = False
        self.queue: list[tuple[Entry, DoneCallback]] = []
        self.delivered: list[Entry] = []

    def produce(self, entry: Entry, on_done: DoneCallback) -> None:
        self.queue.append((entry, on_done))

    def poll(self, timeout_s: float) -> None:
        if self.hold:
            return
        queue, self.queue = self.queue, []
        for entry, cb in queue:
            if self.up:
                self.delivered.append(entry)
                cb(None, False)
            else:
                cb("Local: Message timed out", False)

    def flush(self, timeout_s: float) -> int:
        self.poll(0)
        return 0

    def inflight(self) -> int:
        return len(self.queue)

    def broker_down(self) -> str | None:
        down, self.down = self.down, None
        return down


def test_spool_resumes_unacked_records_and_checkpoint(tmp_path: Path) -> None:
    sp = Spool(tmp_path, max_bytes=1 << 20, segment_bytes=1 << 10)
    sp.append([_e(i) for i in range(50)], {"rings": {"a": 50}})
    for eid in range(30):
        sp.ack(eid)
    sp.close()
    again = Spool(tmp_path, max_bytes=1 << 20, segment_bytes=1 << 10)
    assert again.pending == 20
    assert [again.read(e).value[:4] for e in again.pending_from(0, 100)] == [  # type: ignore[union-attr]
        i.to_bytes(4, "little") for i in range(30, 50)
    ]
    assert again.checkpoint == {"rings": {"a": 50}}
    again.close()


def test_spool_is_bounded_and_reports_what_it_dropped(tmp_path: Path) -> None:
    sp = Spool(tmp_path, max_bytes=4096, segment_bytes=1024)
    for i in range(100):
        sp.append([_e(i, 90)])
    assert sp.size_bytes <= 4096
    assert sp.dropped > 0 and sp.dropped + sp.pending == 100
    assert sp.read(sp.first_pending() or 0) is not None
    sp.close()


def test_torn_tail_is_ignored_on_restart(tmp_path: Path) -> None:
    sp = Spool(tmp_path, max_bytes=1 << 20, segment_bytes=1 << 16)
    sp.append([_e(i) for i in range(3)])
    sp.close()
    seg = sorted(tmp_path.glob("*.seg"))[-1]
    seg.write_bytes(seg.read_bytes()[:-5])
    again = Spool(tmp_path, max_bytes=1 << 20, segment_bytes=1 << 16)
    assert again.pending == 2 and again.corrupt == 1
    again.close()


def _shipper(tmp_path: Path) -> tuple[Shipper, FakeTransport, Callable[[float], None]]:
    now = [0.0]
    tr = FakeTransport()
    sh = Shipper(
        Spool(tmp_path, 1 << 20, 1 << 12), tr, retry_s=1.0, clock=lambda: now[0]
    )

    def advance(dt: float) -> None:
        now[0] += dt

    return sh, tr, advance


def test_outage_spools_then_replays_everything_in_order(tmp_path: Path) -> None:
    sh, tr, advance = _shipper(tmp_path)
    sh.submit([_e(0), _e(1)], None)
    sh.pump()
    assert sh.sent == 2 and sh.spool.pending == 0
    tr.up = False
    sh.submit([_e(2)], None)
    sh.pump()  # delivery fails -> unhealthy
    assert not sh.healthy and sh.failures == 1
    for i in range(3, 8):
        sh.submit([_e(i)], None)
        advance(0.3)
        sh.pump()
    assert sh.spooled == 5 and sh.spool.pending == 6
    tr.up = True
    for _ in range(10):
        advance(1.0)
        sh.pump()
    assert sh.healthy and sh.spool.pending == 0
    got = [int.from_bytes(e.value[:4], "little") for e in tr.delivered]
    assert got == list(range(8))
    sh.spool.close()


def test_permanent_rejection_is_dropped_and_counted(tmp_path: Path) -> None:
    sh, tr, _ = _shipper(tmp_path)

    class Rejecting(FakeTransport):
        def poll(self, timeout_s: float) -> None:
            queue, self.queue = self.queue, []
            for _entry, cb in queue:
                cb("Broker: Message size too large", True)

    sh.transport = Rejecting()
    sh.submit([_e(0)], None)
    sh.pump()
    assert sh.rejected == 1 and sh.spool.pending == 0 and sh.healthy
    sh.spool.close()


def test_brokers_down_spools_at_once_and_says_so(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """librdkafka's 'all brokers down' comes seconds into an outage, long
    before the first delivery times out: the shipper stops producing and logs
    it then, and what it holds back counts as spooled."""
    sh, tr, advance = _shipper(tmp_path)
    sh.submit([_e(0)], None)
    sh.pump()
    tr.hold = True
    sh.submit([_e(1)], None)  # produced, in flight: no callback yet
    tr.down = "Kafka at 127.0.0.1:9 unreachable (1/1 brokers are down)"
    with caplog.at_level(logging.WARNING):
        sh.pump()
    assert not sh.healthy and sh.failures == 0
    said = [r.getMessage() for r in caplog.records]
    assert any("127.0.0.1:9 unreachable" in m and "spooling to" in m for m in said)
    sh.submit([_e(2)], None)
    assert sh.spooled == 1 and sh.spool.pending == 2
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        advance(STATUS_EVERY_S)
        sh.pump()
    assert any("still unreachable: records in the spool: 2" in r.getMessage()
               for r in caplog.records)  # fmt: skip
    tr.hold = False  # back: the record in flight lands, then the spool replays
    for _ in range(5):
        advance(1.0)
        sh.pump()
    assert sh.healthy and sh.spool.pending == 0
    got = [int.from_bytes(e.value[:4], "little") for e in tr.delivered]
    assert got == [0, 1, 2]
    sh.spool.close()
