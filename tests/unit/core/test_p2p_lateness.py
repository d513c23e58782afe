"""Point-to-point pairs: the pipeline schedule is neither a straggler nor a slowdown."""

from __future__ import annotations

import numpy as np

from mycroft.schemas.vocab import OP_NAMES
from mycroft.streams.core.baseline import BaselineBook
from mycroft.streams.core.collective_stat import CollectiveStat
from mycroft.streams.core.config import DetectorConfig
from mycroft.streams.core.detect import DetectContext
from mycroft.streams.core.detect_slow import observe_collectives
from mycroft.streams.core.progress import ProgressStore
from mycroft.streams.core.topology import JobTopology

MS = 1_000_000
STEP_OPS = 6  # micro-batch exchanges of one step on one stage boundary
SCHEDULE_SKEW_MS = (4, 5, 6, 5, 30, 52)  # the last two: after the optimizer


def _ctx() -> DetectContext:
    cfg = DetectorConfig()
    topo = JobTopology()
    for r in range(2):
        topo.rank_host[r] = f"h{r}"
    return DetectContext(
        "j", ProgressStore(cfg.history_ns), topo, BaselineBook(64), cfg
    )


def _pair_op(kind: str, seq: int, skew_ns: int) -> CollectiveStat:
    """Rank 0 (sender) starts ``skew_ns`` after rank 1 (receiver)."""
    t0 = seq * 100 * MS
    begin = np.array([t0 + skew_ns, t0], np.int64)
    return CollectiveStat(
        comm=7,
        seq=seq,
        kind=OP_NAMES.index(kind),
        nbytes=1 << 20,
        ranks=np.array([0, 1], np.int32),
        issue_ns=begin.copy(),
        start_ns=begin,
        end_ns=np.full(2, begin.max() + 2 * MS, np.int64),
        prev_issue_ns=np.full(2, -1, np.int64),
    )


def _fired(
    kind: str, extra_ms: dict[int, int] | None = None, detector: str = "slow_late"
) -> list[int]:
    """Seqs that fired ``detector`` over 12 steps of the same schedule."""
    ctx, rng, fired = _ctx(), np.random.default_rng(3), []
    for seq in range(12 * STEP_OPS):
        skew = SCHEDULE_SKEW_MS[seq % STEP_OPS] + (extra_ms or {}).get(seq, 0)
        op = _pair_op(kind, seq, int((skew + rng.uniform(-0.5, 0.5)) * MS))
        found = observe_collectives(ctx, [(op, int(op.end_ns.max()), {})])
        fired += [seq for a in found if a.detector == detector]
    return fired


def test_a_schedule_skew_that_repeats_every_step_fires_no_p2p_lateness() -> None:
    assert _fired("send") == []
    # the same skew between the two members of a collective is a straggler
    assert _fired("allreduce") != []


def test_a_pipeline_bubble_in_a_pair_span_fires_nothing() -> None:
    bubble = {40: 1500}  # the receiver armed its buffers 1.5 s before the send
    assert _fired("recv", bubble, "slow_span") == []
    assert _fired("recv", bubble) == []
    assert 40 in _fired("allreduce", bubble, "slow_span")
