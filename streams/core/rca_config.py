"""Root-cause scoring knobs: rule weights and caps, one frozen dataclass.

``scoring.WEIGHTS`` documents each rule's component, subject and default
weight; an :class:`RcaConfig` may override any of those weights and holds
the caps that turn scores into an answer. It rides on
``DetectorConfig.rca``, so the edge that builds the detector thresholds
(``mycroft analyze --set``, the worker's ``--detector``) builds it too:
``rca.hostwide_conf=0.5``, ``rca.weight.slow_compute=2``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any

from mycroft.streams.core.evidence import Rule
from mycroft.streams.core.scoring import SHARE_RULES, WEIGHTS


@dataclass(frozen=True)
class RcaConfig:
    """How evidence scores become culprits.

    Attributes:
        weights: Base weights that differ from ``scoring.WEIGHTS``, by rule.
        max_confidence: Highest confidence of any culprit: the rules never
            claim certainty.
        max_culprits: Culprits kept per root cause, best first.
        reasons_shown: Reasons of a suspect joined into its culprit's reason.
        min_culprit_confidence: Slowdown culprits below it are left out of an
            answer: every large job has small timing suspects (a rank a few
            ms late in one group) sharing what the real culprit leaves.
        hostwide_conf: Highest confidence of a culprit named by the
            whole-host timing rule, by lateness in one group only, or by
            finishing last alone (a pcie verdict with no flow or ready
            evidence), and of every slowdown culprit while the wire timing
            has measured nothing since the onset; a published answer at or
            below it is a bound: two rounds in a row of an answer that no
            longer names its top culprit revise it, a slowdown's from half
            its confidence (``incidents.revise``).
        min_timing_ops: A timing verdict (gpu or pcie) on fewer of the rank's
            ops since the onset is capped at ``hostwide_conf``: one late op,
            seen before any flow evidence, is the only suspect and would
            otherwise get ``max_confidence`` (a rank 6 ms late once, 0.2 s
            into a switch congestion that its flows name 6 s later).
        ambiguous_end: Weight of the far end of flagged flows when it is tied
            with the sending NIC (one NIC pair or one sender-receiver pair):
            Table 4 reads G>T as the sender's NIC first, but only more flows
            can tell the two ends apart.
        mismatch_pair_conf: Confidence of a mismatch in a comm of two (no
            majority exists).
        unconsumed_surplus: ``UNCONSUMED_INPUT``: weight of input received
            beyond output produced (a share of the op's bytes).
        ready_behind_bonus: ``FINISHES_LAST``: added when the rank's
            gpu_ready lags its peers'.
        span_share_cap: Most that lateness over the op span adds to a capped
            timing score (``SLOW_COMPUTE``, ``HOST_WIDE_LATE``).
        transfer_slow_ratio: ``SLOW_TRANSFERS``: a sender-receiver pair is
            slowed when its time per chunk grew this much more than the
            job's median pair's, or than its own when the median got faster
            (a third of a NIC's bandwidth lost, or more),
            and at least ``k`` times through a NIC that ``k`` GPUs share
            (what their sending at once costs; ``transfer_times``).
        transfer_p_fault: ...the chance that a pair through a faulty part is
            slowed (below 1: a fault of one direction or one channel, a pair
            too lightly loaded to fill the slowed link).
        transfer_p_noise: ...and the chance that any other pair is (two
            GPUs' transfers meeting on one NIC, wire bursts, jitter).
        transfer_min_before: Transfers a pair needs before the onset for its
            own history to count.
        transfer_min_after: ...and after it.
    """

    weights: Mapping[Rule, float] = field(default_factory=dict, hash=False)
    max_confidence: float = 0.99
    max_culprits: int = 8
    reasons_shown: int = 3
    min_culprit_confidence: float = 0.2
    hostwide_conf: float = 0.6
    min_timing_ops: int = 3
    ambiguous_end: float = 0.8
    mismatch_pair_conf: float = 0.5
    unconsumed_surplus: float = 4.0
    ready_behind_bonus: float = 0.4
    span_share_cap: float = 1.0
    transfer_slow_ratio: float = 1.5
    transfer_p_fault: float = 0.8
    transfer_p_noise: float = 0.1
    transfer_min_before: int = 3
    transfer_min_after: int = 2

    def __post_init__(self) -> None:
        """Reject values no scorer can work with; the error names the key."""
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name in _COUNTS and value < 1:
                raise ValueError(f"rca {f.name} must be >= 1, got {value}")
            if f.name in _SHARES and not 0 < value <= 1:
                raise ValueError(f"rca {f.name} must be in (0, 1], got {value}")
            if f.name in _BONUSES and value < 0:
                raise ValueError(f"rca {f.name} must be >= 0, got {value}")
        if self.transfer_slow_ratio <= 1:
            raise ValueError(
                f"rca transfer_slow_ratio must be > 1, got {self.transfer_slow_ratio}"
            )
        if self.transfer_p_noise >= self.transfer_p_fault or self.transfer_p_fault >= 1:
            raise ValueError(
                "rca transfer_p_noise < transfer_p_fault < 1 must hold, got "
                f"{self.transfer_p_noise} and {self.transfer_p_fault}"
            )
        for name in ("min_culprit_confidence", "hostwide_conf", "mismatch_pair_conf"):
            if getattr(self, name) > self.max_confidence:
                raise ValueError(
                    f"rca {name} ({getattr(self, name)}) is above max_confidence "
                    f"({self.max_confidence}): lower it or raise max_confidence"
                )
        table = {rule: w.weight for rule, w in WEIGHTS.items()}
        for rule, value in self.weights.items():
            if not isinstance(rule, Rule):
                raise ValueError(f"rca weight key {rule!r} is not a Rule")
            if not math.isfinite(value) or value < 0:
                raise ValueError(f"rca weight.{rule} must be >= 0, got {value}")
            if rule in SHARE_RULES and value > 1:
                raise ValueError(
                    f"rca weight.{rule} is a share or a confidence: it must be <= 1"
                )
            table[rule] = float(value)
        object.__setattr__(self, "_table", table)

    def weight(self, rule: Rule) -> float:
        """The base weight of ``rule``."""
        table: dict[Rule, float] = self.__dict__["_table"]
        return table[rule]

    def plus(self, rule: Rule, extra: float) -> float:
        """``rule``'s weight plus ``extra`` (a share it saw)."""
        return self.weight(rule) + extra

    def link_score(self, rule: Rule, n: int) -> float:
        """Score of a link verdict that explains ``n`` flagged flows: more
        flows, more confidence (a revision needs a more confident answer)."""
        w = self.weight(rule)
        return w + w * math.log2(1 + n)

    def timing_score(
        self,
        rule: Rule,
        late: float,
        span: float,
        *,
        bonus: float = 0.0,
        capped: bool = False,
    ) -> float:
        """``rule``'s weight plus ``bonus`` plus lateness ``late`` over the op
        ``span`` (ns), that share at most ``span_share_cap`` when ``capped``."""
        share = late / max(span, 1.0)
        if capped:
            share = min(self.span_share_cap, share)
        return self.weight(rule) + bonus + share

    def unconsumed_score(self, got: float, made: float, held: float) -> float:
        """``UNCONSUMED_INPUT``: input received beyond output produced, and
        the share of input held (shares of the op's bytes)."""
        surplus = self.unconsumed_surplus * (got - made)
        return self.weight(Rule.UNCONSUMED_INPUT) + surplus + held


_COUNTS = frozenset(
    {
        "max_culprits",
        "reasons_shown",
        "min_timing_ops",
        "transfer_min_before",
        "transfer_min_after",
    }
)
_SHARES = frozenset(
    {
        "max_confidence",
        "hostwide_conf",
        "ambiguous_end",
        "mismatch_pair_conf",
        "transfer_p_fault",
        "transfer_p_noise",
    }
)
_BONUSES = frozenset(
    {
        "min_culprit_confidence",
        "unconsumed_surplus",
        "ready_behind_bonus",
        "span_share_cap",
    }
)

DEFAULT_RCA = RcaConfig()
"""The default scoring."""

_RULE_NAMES = frozenset(r.value for r in Rule)

WEIGHT_PREFIX = "weight."
"""Override keys ``weight.<rule>`` set one rule's base weight."""


def rca_with_overrides(rca: RcaConfig, pairs: Mapping[str, str]) -> RcaConfig:
    """``rca`` with ``{key: text}`` overrides (keys without the ``rca.``
    prefix: ``hostwide_conf``, ``weight.slow_compute``).

    Raises:
        ValueError: an unknown key or rule, a value that is not a number, or
            a resulting config that ``__post_init__`` rejects.
    """
    known = {f.name: type(getattr(rca, f.name)) for f in fields(rca)}
    known.pop("weights")
    changes: dict[str, Any] = {}
    weights = dict(rca.weights)
    for key, text in pairs.items():
        if key.startswith(WEIGHT_PREFIX):
            name = key.removeprefix(WEIGHT_PREFIX).lower()
            if name not in _RULE_NAMES:
                raise ValueError(
                    f"rca override {key!r}: no rule {name!r}; rules are "
                    f"{', '.join(sorted(Rule))} (streams/core/evidence.py)"
                )
            weights[Rule(name)] = parse_value(f"rca {key}", text, float)
        elif (name := key.replace("-", "_")) in known:
            changes[name] = parse_value(f"rca {name}", text, known[name])
        else:
            raise ValueError(
                f"rca override {key!r}: keys are {', '.join(sorted(known))} "
                f"and weight.<rule> (streams/core/rca_config.py)"
            )
    return replace(rca, weights=weights, **changes)


def parse_value(what: str, text: str, kind: type) -> Any:
    """``text`` as a ``kind`` (int or float) for the override ``what``.

    Raises:
        ValueError: ``text`` is not one, naming ``what`` and the type.
    """
    try:
        return kind(text.strip())
    except ValueError:
        raise ValueError(
            f"{what} takes {'an integer' if kind is int else 'a number'}, "
            f"got {text.strip()!r}"
        ) from None
