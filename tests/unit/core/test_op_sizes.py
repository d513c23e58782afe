"""Op-size agreement follows the op kind: uneven all-to-all splits are no
mismatch, while a disagreement on a size that must agree, or on the op
itself, still is."""

from __future__ import annotations

import numpy as np

from mycroft.schemas.columns import DONE_OP_COLUMNS, empty
from mycroft.schemas.op_sizes import SIZE_RULES, SizeRule, sizes_may_differ
from mycroft.schemas.records import BatchHeader, CompletionBatch
from mycroft.schemas.vocab import OP_NAMES, FaultKind
from mycroft.streams.core.completions import CompletionTracker
from mycroft.streams.core.detect import detect_mismatch
from mycroft.streams.core.engine import Analyzer
from mycroft.streams.core.progress import _OP_PLUS

ALLTOALL = OP_NAMES.index("alltoall")
ALLREDUCE = OP_NAMES.index("allreduce")
MS = 1_000_000


def _done(kinds: list[int], sizes: list[int], comm: int = 7) -> np.ndarray:
    """One completion row per rank 0.. of op ``(comm, 5)``."""
    done = empty(DONE_OP_COLUMNS, len(kinds))
    done["rank"], done["comm"], done["seq"] = np.arange(len(kinds)), comm, 5
    done["kind"], done["bytes"] = kinds, sizes
    done["issue_ns"], done["start_ns"], done["end_ns"] = MS, 2 * MS, 3 * MS
    return done


def test_every_op_name_has_a_size_rule() -> None:
    assert set(SIZE_RULES) == set(OP_NAMES)
    assert SIZE_RULES["alltoall"] is SizeRule.PER_RANK
    assert SIZE_RULES["allreduce"] is SizeRule.EQUAL
    codes = np.arange(len(OP_NAMES) + 3, dtype=np.uint8)
    per_rank = [OP_NAMES.index(n) for n in ("alltoall", "window", "coalesced")]
    assert np.flatnonzero(sizes_may_differ(codes)).tolist() == sorted(per_rank)


def test_uneven_all_to_all_sizes_are_not_a_mismatch() -> None:
    an = Analyzer("j")
    done = _done([ALLTOALL] * 4, [3 << 20, 1 << 20, 5 << 20, 2 << 20])
    assert detect_mismatch(an.ctx, 0, done) == []


def test_an_all_reduce_of_another_size_is_still_a_mismatch() -> None:
    an = Analyzer("j")
    done = _done([ALLREDUCE] * 4, [1 << 20, 1 << 20, 2 << 20, 1 << 20])
    found = detect_mismatch(an.ctx, 0, done)
    assert [(a.ranks, a.kind) for a in found] == [((2,), FaultKind.MISMATCH)]


def test_a_member_running_another_op_in_an_all_to_all_is_a_mismatch() -> None:
    """Sizes of an all-to-all may differ, its op may not: a rank that runs
    an all-reduce where its peers run an all-to-all is named."""
    an = Analyzer("j")
    kinds = [ALLTOALL, ALLTOALL, ALLREDUCE, ALLTOALL]
    found = detect_mismatch(an.ctx, 0, _done(kinds, [3, 1, 3, 2]))
    assert [a.ranks for a in found] == [(2,)]
    assert "alltoall/per-rank sizes: [0, 1, 3]" in found[0].summary


def test_an_in_flight_all_to_all_of_its_own_size_agrees_with_completed_ones() -> None:
    an = Analyzer("j")
    ops = np.zeros(1, dtype=_OP_PLUS)
    ops[["rank", "comm", "seq", "kind", "bytes"]] = (3, 7, 5, ALLTOALL, 9 << 20)
    an.ctx.store.host("h1").ops = ops
    done = _done([ALLTOALL] * 3, [1 << 20, 2 << 20, 3 << 20])
    assert detect_mismatch(an.ctx, 0, done) == []
    ops["kind"] = ALLREDUCE
    assert [a.ranks for a in detect_mismatch(an.ctx, 0, done)] == [(3,)]


def test_completed_uneven_all_to_all_is_kept_as_agreeing_with_its_median() -> None:
    """The tracker keeps no signature rows for an uneven all-to-all and
    keys its stat by the members' median size (a stable baseline bucket)."""
    tracker = CompletionTracker()
    done = _done([ALLTOALL] * 4, [1 << 20, 4 << 20, 2 << 20, 8 << 20])
    stats = tracker.ingest(
        CompletionBatch(BatchHeader("j", "h", 1, 0, 0, 100), done), {7: 4}, 0
    )
    assert [(s.kind, s.nbytes) for s in stats] == [(ALLTOALL, 3 << 20)]
    assert len(tracker.signature_rows()) == 0
    uneven = _done([ALLREDUCE] * 4, [1, 1, 2, 1], comm=8)
    tracker.ingest(
        CompletionBatch(BatchHeader("j", "h", 1, 1, 0, 100), uneven), {8: 4}, 0
    )
    assert set(tracker.signature_rows()["comm"].tolist()) == {8}


def test_a_peer_pair_that_disagrees_on_its_transfer_is_a_mismatch() -> None:
    """The NCCL plugin writes an all-to-all as per-peer send/recv pairs on a
    two-member communicator: what A sends to B must be what B expects."""
    send, recv = OP_NAMES.index("send"), OP_NAMES.index("recv")
    an = Analyzer("j")
    agree = _done([send, recv], [4096, 4096], comm=11)
    assert detect_mismatch(an.ctx, 0, agree) == []
    found = detect_mismatch(an.ctx, 0, _done([send, recv], [4096, 8192], comm=11))
    assert [(a.comms, a.kind) for a in found] == [((11,), FaultKind.MISMATCH)]
