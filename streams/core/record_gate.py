"""Per-job gate between decoded records and state: the input contract applied.

``RecordGate.admit`` takes one decoded raw record and returns what may reach
the engine: the record's valid rows (a batch cut to them, same header), and
rows held earlier that the topology now explains. Rows that break the
contract (``contract.py``, ``row_checks.py``) become :class:`Rejection` s,
counted per reason and host, kept for the worker to dead-letter (``take``).
Rows of a (rank, comm) the topology does not declare yet wait, bounded in
count and event time, then are rejected. A host with ``flag_after`` invalid
records within ``flag_window_ns`` is flagged (``flagged``).
"""

from __future__ import annotations

from collections import Counter, deque
from dataclasses import dataclass, field
from typing import TypeAlias

import numpy as np

from mycroft.schemas.records import (
    CompletionBatch,
    Heartbeat,
    Record,
    StateBatch,
    Topology,
)
from mycroft.streams.core import row_checks as rows
from mycroft.streams.core import row_fastpath as fast
from mycroft.streams.core.contract import Contract, Reason, Rejection
from mycroft.streams.core.host_clocks import HostClocks
from mycroft.streams.core.topology_contract import TopologyView, topology_problem

MAX_KEPT = 1024
"""Rejections kept for the edge between two ``take`` calls (the rest counted)."""
Batch: TypeAlias = StateBatch | CompletionBatch
_Held: TypeAlias = tuple[int, Batch, frozenset[int] | None]
"""Held rows: (event-time deadline, rows as sent, ``_admit_batch``'s ``rel``)."""


@dataclass
class _Host:
    """What the gate knows of one host's own history."""

    flow_tick: int = -1
    flow_keys: np.ndarray = field(default_factory=lambda: np.zeros(0, np.uint64))
    flow_counts: np.ndarray = field(default_factory=lambda: np.zeros((0, 3), np.int32))
    invalid_ns: deque[int] = field(default_factory=deque)


@dataclass
class _Split:
    """Per-row codes of one batch: 0 valid, else a reason code; ``held`` rows."""

    codes: dict[str, np.ndarray]
    held: dict[str, np.ndarray]


class RecordGate:
    """The input contract of one job, with the state it needs (picklable)."""

    def __init__(self, contract: Contract | None = None) -> None:
        self.contract = contract or Contract()
        self.topo = TopologyView()
        self.hosts: dict[str, _Host] = {}
        self.clocks = HostClocks(self.contract)
        self._rc_seen: dict[str, tuple[bytes, int, np.ndarray, np.ndarray]] = {}
        self._keys: tuple[object, np.ndarray] = (None, np.zeros(0, np.uint64))
        self._owner: tuple[object, np.ndarray | None] = (None, None)
        # (event-time deadline, rows, comms whose flow peers are positions:
        # None when the host had declared nothing, decided on release)
        self.held: list[_Held] = []
        self.rejected: list[Rejection] = []
        self.counts: Counter[tuple[str, str]] = Counter()
        self.flagged: set[str] = set()
        self.newly_flagged: list[str] = []
        self.left: set[str] = set()
        self.released = 0  # of the last ``admit``'s parts, held ones at its end

    def restore_state(self, state: dict[str, object]) -> None:
        """Restore from :meth:`snapshot_state`."""
        self.__dict__.update(state)

    def snapshot_state(self) -> dict[str, object]:
        """Snapshot state (worker snapshots) without the per-batch caches."""
        state = dict(self.__dict__)
        state["_keys"], state["_owner"] = (None, np.zeros(0, np.uint64)), (None, None)
        return state

    def admit(self, record: Record, now_ns: int) -> list[Record]:
        """Return the parts of ``record`` (and of held rows) that may reach state.

        The last ``released`` of them are rows held earlier, released now.
        """
        self.released = 0
        if isinstance(record, Topology):
            return self._admit_topology(record, now_ns)
        if isinstance(record, Heartbeat):
            return [record] if self._admit_heartbeat(record) else []
        if isinstance(record, StateBatch | CompletionBatch):
            return self._admit_batch(record, now_ns + self.contract.hold_ns)
        return [record]

    def host_left(self, host: str) -> None:
        """A tombstone on the topology topic: ``host`` left the job."""
        self.topo.drop_host(host)
        self.left.add(host)

    def expire(self, now_ns: int) -> None:
        """Reject held rows whose wait ended by event time ``now_ns``."""
        if not self.held or self.held[0][0] > now_ns:
            return
        due = [b for d, b, _ in self.held if d <= now_ns]
        self.held = [e for e in self.held if e[0] > now_ns]
        for batch in due:
            self._reject_unexplained(batch)

    def take(self) -> list[Rejection]:
        """Rejections since the last call (for the dead-letter topic)."""
        out, self.rejected = self.rejected, []
        return out

    # -- record kinds -------------------------------------------------------

    def _admit_topology(self, topo: Topology, now_ns: int) -> list[Record]:
        problem = topology_problem(topo, self.contract)
        conflict = "" if problem else self.topo.conflict(topo)
        if conflict:
            problem = Reason.BAD_TOPOLOGY, f"conflicting members: {conflict}"
        if problem is not None:
            reason, detail = problem
            self._reject(Rejection(reason, "Topology", topo.host, 1, detail, topo))
            return []
        out: list[Record] = list(self.topo.add(topo))
        own = len(out)
        self.left.discard(topo.host)
        waiting, self.held = self.held, []
        for deadline, batch, rel in waiting:
            out.extend(self._admit_batch(batch, deadline, again=True, rel=rel))
        self.released = len(out) - own
        return out

    def _admit_heartbeat(self, hb: Heartbeat) -> bool:
        problem = self._record_problem(hb.job_id, hb.host, hb.ts_ns)
        if problem is None and any(r.rank < 0 for r in hb.ranks):
            problem = Reason.RANK_RANGE, "a rank health entry has a negative rank"
        if problem is not None:
            self._reject(Rejection(*problem[:1], "Heartbeat", hb.host, 1, problem[1]))
            return False
        self._host(hb.host)
        self.clocks.accept(hb.host, hb.ts_ns)
        return True

    def _admit_batch(
        self,
        b: Batch,
        deadline: int,
        again: bool = False,
        rel: frozenset[int] | None = None,
    ) -> list[Record]:
        """``rel``: the comms whose flow peers are positions in ``b``, as the
        host's topology said when ``b`` arrived (held rows keep them; ``None``
        if it had said nothing, then its topology at release decides)."""
        h = b.header
        name = type(b).__name__
        problem = self._record_problem(h.job_id, h.host, h.tick_ns, again)
        if problem is None:
            problem = self._size_problem(b)
        if problem is not None:
            reason, detail = problem
            self._reject(
                Rejection(reason, name, h.host, _nrows(b), detail, b, h.tick_ns)
            )
            return []
        rel = self.topo.relative(h.host) if rel is None else rel
        as_sent, b = b, self._globalize(b, rel or frozenset())
        if self._clean(b):
            self.clocks.accept(h.host, h.tick_ns)
            if isinstance(b, StateBatch):
                self._remember_flows(self._host(h.host), b)
            return [b]
        split = self._split(b)
        if isinstance(b, StateBatch):
            assert isinstance(as_sent, StateBatch)  # noqa: S101 - same type
            return self._admit_snapshot(b, split, (deadline, as_sent, rel))
        if not any(c.any() for c in split.codes.values()) and not any(
            h.any() for h in split.held.values()
        ):
            self.clocks.accept(h.host, h.tick_ns)
            return [b]
        held = _cut(as_sent, split.held)  # peers as sent: mapped when released
        if _nrows(held):
            self._hold((deadline, held, rel))
        for code in sorted(set(np.concatenate(list(split.codes.values())).tolist())):
            if code:
                self._reject_code(b, split.codes, code)
        keep = {g: (c == 0) & ~split.held[g] for g, c in split.codes.items()}
        valid = _cut(b, keep)
        if not _nrows(valid):
            return []
        hs = self._host(h.host)
        self.clocks.accept(h.host, h.tick_ns)
        if isinstance(valid, StateBatch):
            self._remember_flows(hs, valid)
        return [valid]

    def _admit_snapshot(
        self, b: StateBatch, split: _Split, hold: _Held
    ) -> list[Record]:
        """A state batch is one snapshot of the host: a part of it would
        read as ops that ended and ranks that fell silent, so it is taken,
        held or rejected whole (reason: its first bad row's)."""
        codes = np.concatenate([split.codes[g] for g in ("rc", "op", "flow")])
        bad = codes[codes > 0]
        if len(bad):
            found, n = np.unique(bad, return_counts=True)
            tally = ", ".join(
                f"{k} {rows.CODES[c - 1].value}" for c, k in zip(found, n, strict=True)
            )
            reason = rows.CODES[int(bad[0]) - 1]
            self._reject_whole(b, reason, f"snapshot rejected whole: rows {tally}")
            return []
        if any(h.any() for h in split.held.values()):
            self._hold(hold)
            return []
        hs = self._host(b.header.host)
        self.clocks.accept(b.header.host, b.header.tick_ns)
        self._remember_flows(hs, b)
        return [b]

    # -- checks -------------------------------------------------------------

    def _record_problem(
        self, job_id: str, host: str, t: int, again: bool = False
    ) -> tuple[Reason, str] | None:
        return self.clocks.problem(job_id, host, t, again)

    def _size_problem(self, b: Batch) -> tuple[Reason, str] | None:
        c = self.contract
        sizes = {"op": len(b.op), "flow": len(b.flow)}
        if isinstance(b, StateBatch):
            sizes["rc"] = len(b.rc)
            if not len(b.rc):
                return Reason.EMPTY_STATE, "a state batch without rank-state rows"
        big = {g: n for g, n in sizes.items() if n > c.max_rows}
        if big:
            return Reason.TOO_LARGE, f"rows {big} over the {c.max_rows}-row limit"
        if self._owners(b) is None:
            return Reason.LAYOUT, "op_nflows does not lay out the flow rows"
        return None

    def _bounds(self, b: Batch) -> tuple[int, int]:
        """The row-time range of ``b``: from year 2000 to just after its tick."""
        return self.contract.min_time_ns, b.header.tick_ns + self.contract.row_slack_ns

    def _clean(self, b: Batch) -> bool:
        """Whether every row of ``b`` passes, by whole-batch checks
        (``row_fastpath``); ``False`` leaves the per-row checks to say why."""
        lo, hi = self._bounds(b)
        host, owner = b.header.host, self._owners(b)
        assert owner is not None  # noqa: S101 - checked by _size_problem
        if isinstance(b, StateBatch):
            if not fast.state_valid(b, lo, hi):
                return False
            if not self.topo.all_placed(b.rc["rank"], b.rc["comm"], host):
                return False
        elif not fast.done_valid(b, lo, hi):
            return False
        if not self.topo.all_placed(b.op["rank"], b.op["comm"], host):
            return False
        if not self.topo.members(b.flow["peer"], b.op["comm"][owner]).all():
            return False
        return not (isinstance(b, StateBatch) and self._regressed(b, owner).any())

    def _split(self, b: Batch) -> _Split:
        """Reason codes and held rows of every row group of ``b``."""
        host = b.header.host
        lo, hi = self._bounds(b)
        owner = self._owners(b)
        assert owner is not None  # noqa: S101 - checked by _size_problem
        if isinstance(b, StateBatch):
            op_c, fl_c = rows.op_codes(b.op, lo, hi), rows.flow_codes(b.flow, lo, hi)
        else:
            op_c = rows.done_op_codes(b.op, lo, hi)
            fl_c = rows.done_flow_codes(b.flow, lo, hi)
        op_held = self.topo.place(b.op["rank"], b.op["comm"], host, op_c)
        peers = self.topo.members(b.flow["peer"], b.op["comm"][owner])
        rows.mark(fl_c, ~peers & ~op_held[owner], Reason.RANK_RANGE)
        if isinstance(b, StateBatch):
            self._regress(b, owner, fl_c)
        rows.fold_flows(op_c, fl_c, owner)
        op_held &= op_c == 0
        codes, held = (
            {"op": op_c, "flow": fl_c},
            {"op": op_held, "flow": op_held[owner]},
        )
        if isinstance(b, StateBatch):
            rc_c = rows.rc_codes(b.rc, lo, hi)
            elsewhere, unplaced = self._locate_rc(b.rc, host)
            rows.mark(rc_c, elsewhere, Reason.RANK_NOT_ON_HOST)
            held["rc"], codes["rc"] = (rc_c == 0) & unplaced, rc_c
        return _Split(codes, held)

    def _locate_rc(self, rc: np.ndarray, host: str) -> tuple[np.ndarray, np.ndarray]:
        """``TopologyView.locate`` of rank-state rows, cached per host: a
        host reports the same (rank, comm) rows tick after tick."""
        key = rc["rank"].tobytes() + rc["comm"].tobytes()
        hit = self._rc_seen.get(host)
        if hit is not None and hit[0] == key and hit[1] == self.topo.version:
            return hit[2], hit[3]
        elsewhere, unplaced = self.topo.locate(rc["rank"], rc["comm"], host)
        self._rc_seen[host] = (key, self.topo.version, elsewhere, unplaced)
        return elsewhere, unplaced

    def _regress(self, b: StateBatch, owner: np.ndarray, fl_c: np.ndarray) -> None:
        """Mark flow counters below the same flow's at the host's previous tick."""
        rows.mark(fl_c, self._regressed(b, owner), Reason.COUNTER_REGRESS)

    def _regressed(self, b: StateBatch, owner: np.ndarray) -> np.ndarray:
        """Flows of ``b`` whose counters went below the host's previous tick's."""
        hs = self.hosts.get(b.header.host)
        if hs is None or not len(hs.flow_keys) or b.header.tick_ns <= hs.flow_tick:
            return np.zeros(len(b.flow), dtype=bool)
        keys = self._keys_of(b, owner)
        at = np.minimum(np.searchsorted(hs.flow_keys, keys), len(hs.flow_keys) - 1)
        same = hs.flow_keys[at] == keys
        now = np.stack([b.flow[n] for n in ("gpu_ready", "transmitted", "done")], 1)
        return np.asarray(same & (now < hs.flow_counts[at]).any(axis=1))

    def _remember_flows(self, hs: _Host, b: StateBatch) -> None:
        if b.header.tick_ns < hs.flow_tick:
            return
        owner = self._owners(b)
        if owner is None:
            return
        keys = self._keys_of(b, owner)
        order = np.argsort(keys, kind="stable")
        counts = np.stack([b.flow[n] for n in ("gpu_ready", "transmitted", "done")], 1)
        hs.flow_keys, hs.flow_counts = keys[order], counts[order]
        hs.flow_tick = b.header.tick_ns

    def _owners(self, b: Batch) -> np.ndarray | None:
        """``row_checks.owners`` of ``b``, computed once per batch."""
        if self._owner[0] is not b:
            self._owner = (b, rows.owners(b.op["nflows"], len(b.flow)))
        return self._owner[1]

    def _keys_of(self, b: StateBatch, owner: np.ndarray) -> np.ndarray:
        """Flow keys of ``b``, computed once per batch (regress, remember)."""
        if self._keys[0] is not b:
            self._keys = (b, rows.flow_keys(b.op, b.flow, owner))
        return self._keys[1]

    # -- holding and rejecting ---------------------------------------------

    def _globalize(self, b: Batch, rel: frozenset[int]) -> Batch:
        """``b`` with flow peers of the complete comms of ``rel`` (positions
        in the comm) mapped to global ranks; ``b`` when there are none."""
        owner = self._owners(b)
        if not rel or not len(b.flow) or owner is None:
            return b
        peer = self.topo.global_peers(b.op["comm"][owner], b.flow["peer"], rel)
        if peer is None:
            return b
        flow = b.flow.copy()
        flow["peer"] = peer
        if isinstance(b, StateBatch):
            return StateBatch(b.header, b.rc, b.op, flow)
        return CompletionBatch(b.header, b.op, flow)

    def _hold(self, entry: _Held) -> None:
        self.held.append(entry)
        self.held.sort(key=lambda e: e[0])
        while len(self.held) > self.contract.max_held:
            _, old, _ = self.held.pop(0)
            self._reject_whole(old, Reason.HOLD_OVERFLOW, "held rows over the bound")

    def _reject_unexplained(self, b: Batch) -> None:
        """Held rows the topology never explained: a rank beyond every
        declared one is out of range, else its (rank, comm) is unknown."""
        ranks = [b.op["rank"]] + ([b.rc["rank"]] if isinstance(b, StateBatch) else [])
        top = max((int(r.max()) for r in ranks if len(r)), default=-1)
        if top >= self.topo.world:
            reason, why = Reason.RANK_RANGE, f"rank {top} is beyond the job's ranks"
        else:
            reason, why = Reason.UNKNOWN_RANK, "the topology never declared them"
        self._reject_whole(
            b, reason, f"held {self.contract.hold_ns / 1e9:.0f} s: {why}"
        )

    def _reject_code(
        self, b: Batch, codes: dict[str, np.ndarray], code: int, extra: str = ""
    ) -> None:
        part = _cut(b, {g: c == code for g, c in codes.items()})
        reason = rows.CODES[code - 1]
        n = _nrows(part)
        detail = f"{n} row(s): {reason.value}{extra}"
        h = b.header
        self._reject(
            Rejection(reason, type(b).__name__, h.host, n, detail, part, h.tick_ns)
        )

    def _reject_whole(self, b: Batch, reason: Reason, detail: str) -> None:
        h = b.header
        self._reject(
            Rejection(reason, type(b).__name__, h.host, _nrows(b), detail, b, h.tick_ns)
        )

    def _reject(self, r: Rejection) -> None:
        host = (
            r.host
            if r.host in self.hosts or r.host in self.topo.hosts
            else "undeclared"
        )
        self.counts[(r.reason.value, host)] += 1
        if len(self.rejected) < MAX_KEPT:
            self.rejected.append(r)
        self._flag(host, r.time_ns)

    def _flag(self, host: str, t_ns: int) -> None:
        c = self.contract
        hs = self._host(host) if host != "undeclared" else None
        if hs is None or host in self.flagged:
            return
        hs.invalid_ns.append(t_ns)
        while hs.invalid_ns and hs.invalid_ns[0] < t_ns - c.flag_window_ns:
            hs.invalid_ns.popleft()
        if len(hs.invalid_ns) >= c.flag_after:
            self.flagged.add(host)
            self.newly_flagged.append(host)

    def _host(self, name: str) -> _Host:
        hs = self.hosts.get(name)
        if hs is None:
            hs = self.hosts[name] = _Host()
        return hs


def _groups(b: Batch) -> tuple[str, ...]:
    return ("rc", "op", "flow") if isinstance(b, StateBatch) else ("op", "flow")


def _nrows(b: Batch) -> int:
    return sum(len(getattr(b, g)) for g in _groups(b))


def _cut(b: Batch, keep: dict[str, np.ndarray]) -> Batch:
    """``b`` with only the rows of ``keep`` (same header)."""
    if isinstance(b, StateBatch):
        return StateBatch(
            b.header, b.rc[keep["rc"]], b.op[keep["op"]], b.flow[keep["flow"]]
        )
    return CompletionBatch(b.header, b.op[keep["op"]], b.flow[keep["flow"]])
