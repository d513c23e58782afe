"""Adaptive, robust baselines: median and MAD over a ring buffer of samples."""

from __future__ import annotations

from bisect import bisect_left, insort
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TypeVar

import numpy as np

from mycroft.streams.core.baseline_columns import (
    MAD_TO_SIGMA,
    WARM_SAMPLES,
    BaselineColumns,
    Rule,
)
from mycroft.streams.core.config import DetectorConfig
from mycroft.streams.core.hold_back import HOLD_ROW
from mycroft.streams.core.scoring import PEERS


def _median(ordered: list[float]) -> float:
    """Median of an already sorted list (0.0 when empty)."""
    n = len(ordered)
    if n == 0:
        return 0.0
    mid = n // 2
    return ordered[mid] if n % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def _median_abs_dev(ordered: list[float], med: float) -> float:
    """Median of ``|x - med|`` over a sorted list, in O(log n) steps.

    The deviations below ``med`` (read right to left) and those at or above
    it (read left to right) are two sorted runs. Bisecting how many of the
    ``k + 1`` smallest come from the lower run finds the k-th smallest without
    building or sorting a list; for an even count the next one is the
    smaller of the two runs' next items.
    """
    n = len(ordered)
    if n == 0:
        return 0.0
    split = bisect_left(ordered, med)
    n_lo, n_hi = split, n - split
    k = (n - 1) // 2  # the lower middle, 0-based
    a, b = max(0, k + 1 - n_hi), min(k + 1, n_lo)
    while True:
        i = (a + b) // 2  # deviations taken from the lower run
        j = k + 1 - i
        if (
            i < n_lo
            and j > 0
            and ordered[split + j - 1] - med > med - ordered[split - 1 - i]
        ):
            a = i + 1
        elif i > 0 and j < n_hi and med - ordered[split - i] > ordered[split + j] - med:
            b = i - 1
        else:
            break
    lo_last = med - ordered[split - i] if i > 0 else 0.0
    hi_last = ordered[split + j - 1] - med if j > 0 else 0.0
    kth = max(lo_last, hi_last)
    if n % 2:
        return kth
    lo_next = med - ordered[split - 1 - i] if i < n_lo else float("inf")
    hi_next = ordered[split + j] - med if j < n_hi else float("inf")
    return (kth + min(lo_next, hi_next)) / 2


class Verdict(StrEnum):
    """How a sample compares with its baseline."""

    WARMUP = "warmup"
    NORMAL = "normal"
    HIGH = "high"
    SEVERE = "severe"


@dataclass
class RobustBaseline:
    """Median/MAD baseline of one quantity with outlier rejection.

    Samples judged HIGH or SEVERE are not added, so a slowdown never becomes
    the new normal while it lasts; ``recent`` remembers the last verdicts for
    the persistence rule.
    """

    window: int
    values: deque[float] = field(default_factory=deque)
    ordered: list[float] = field(default_factory=list)  # ``values``, sorted
    recent: deque[bool] = field(default_factory=deque)
    last: deque[float] = field(default_factory=deque)
    shift: bool = False  # the last observe() saw a sustained shift
    _stats: tuple[float, float] | None = None

    def snapshot_state(self) -> tuple[int, list[float], list[bool], list[float], bool]:
        """Snapshot state (worker snapshots) as plain lists: a 1,024-rank job holds
        thousands of baselines; the sorted copy and the cache are rebuilt."""
        return (
            self.window,
            list(self.values),
            list(self.recent),
            list(self.last),
            self.shift,
        )

    def restore_state(
        self, state: tuple[int, list[float], list[bool], list[float], bool]
    ) -> None:
        """Restore from :meth:`snapshot_state`."""
        self.window, values, recent, last, self.shift = state
        self.values, self.ordered = deque(values), sorted(values)
        self.recent, self.last, self._stats = deque(recent), deque(last), None

    def stats(self) -> tuple[float, float]:
        """Return ``(median, sigma)`` of the kept samples (sigma = 1.4826 MAD)."""
        if self._stats is None:
            # This runs for every rank of every completed collective: the
            # window is kept sorted as it changes (insort/delete are memmoves)
            # and the MAD is selected from it, never sorted anew.
            med = _median(self.ordered)
            mad = _median_abs_dev(self.ordered, med)
            self._stats = (med, MAD_TO_SIGMA * mad)
        return self._stats

    def threshold(self, cfg: DetectorConfig, floor: float) -> float:
        """Return the value above which a sample is HIGH (same unit as samples)."""
        med, sigma = self.stats()
        return float(
            max(med * cfg.slow_ratio_min, med + cfg.slow_mad_k * sigma, med + floor)
        )

    def judge(self, value: float, cfg: DetectorConfig, floor: float) -> Verdict:
        """Classify ``value`` without adding it.

        Args:
            value: The new sample.
            cfg: Thresholds (ratio, MAD multiplier, severe rule).
            floor: Absolute margin above the median, same unit as ``value``.
        """
        if len(self.values) < cfg.warmup_samples:
            return Verdict.WARMUP
        med, _ = self.stats()
        if value > self.threshold(cfg, floor):
            severe = value > max(med * cfg.severe_ratio, med + cfg.severe_extra_s * 1e9)
            return Verdict.SEVERE if severe else Verdict.HIGH
        return Verdict.NORMAL

    def observe(
        self,
        value: float,
        cfg: DetectorConfig,
        floor: float,
        *,
        shift: bool = False,
        of: int | None = None,
    ) -> Verdict:
        """Judge ``value``, remember the verdict and learn it if it is normal.

        With ``shift``, also set :attr:`shift` (see :meth:`_shifted`), judged
        against the same baseline as the verdict. ``of`` is the persistence
        window in samples (default ``cfg.slow_of``); keep it the same for
        every call on one baseline.
        """
        of = of or cfg.slow_of
        verdict = self.judge(value, cfg, floor)
        out = verdict in (Verdict.HIGH, Verdict.SEVERE)
        self.recent.append(out)
        while len(self.recent) > of:
            self.recent.popleft()
        self.last.append(value)
        while len(self.last) > of:
            self.last.popleft()
        warm = verdict is not Verdict.WARMUP
        self.shift = shift and warm and self._shifted(cfg, floor, of)
        if not out:
            self.values.append(value)
            insort(self.ordered, value)
            while len(self.values) > self.window:
                del self.ordered[bisect_left(self.ordered, self.values.popleft())]
            self._stats = None
        return verdict

    def persistent(self, cfg: DetectorConfig, need: int | None = None) -> bool:
        """Return whether at least ``need`` (default ``cfg.slow_persist``) of
        the recent samples were out of band."""
        return bool(sum(self.recent) >= (need or cfg.slow_persist))

    def _shifted(self, cfg: DetectorConfig, floor: float, of: int) -> bool:
        """Return whether the last ``of`` samples moved as a whole.

        A sustained shift (a straggler that became slow and stays so) on a
        noisy quantity can sit below the single-sample band for ever, and
        the in-band part of it is learned. The median of the last samples
        varies far less than one sample (about 0.56 sigma for 5), so it is
        held to ``slow_shift_k`` sigma instead of ``slow_mad_k``; the newest
        sample must be above that line too (the shift is still going on).
        """
        if len(self.last) < of:
            return False
        med, sigma = self.stats()
        k = cfg.slow_shift_k
        line = max(med * cfg.slow_ratio_min, med + k * sigma, med + floor)
        return self.last[-1] > line and _median(sorted(self.last)) > line

    @property
    def warm(self) -> bool:
        """Whether the baseline has seen enough normal samples to judge."""
        return len(self.values) >= WARM_SAMPLES


FAMILY_RULES: dict[str, Callable[[DetectorConfig], Rule]] = {
    "late": lambda c: Rule(c.late_of, c.late_persist, shift=True),
    "xfer": lambda c: Rule(c.slow_of, c.slow_persist, recur=True),
    "span": lambda c: Rule(c.slow_of, c.slow_persist, fire_high=False),
    "span_any": lambda c: Rule(c.slow_of, c.slow_persist, fire_high=False),
}
"""Key families kept as :class:`BaselineColumns` (the last item of their keys):
the per-collective metrics, fed in blocks (``detect_slow``)."""


class ColumnBaseline:
    """One key of a :class:`BaselineColumns`, with ``RobustBaseline``'s reads
    and a one-sample ``observe`` (tests, tools; the detectors feed blocks)."""

    def __init__(self, columns: BaselineColumns, row: int) -> None:
        self.columns, self.row = columns, row

    def stats(self) -> tuple[float, float]:
        """Return ``(median, sigma)`` of the kept samples."""
        med, sigma = self.columns.stats(np.array([self.row]))
        return float(med[0]), float(sigma[0])

    @property
    def warm(self) -> bool:
        """Whether the baseline has seen enough normal samples to judge."""
        return self.columns.count(self.row) >= WARM_SAMPLES

    def observe(self, value: float, cfg: DetectorConfig, floor: float) -> Verdict:
        """Judge, remember and learn one sample under the family's rule."""
        one = np.array([self.row])
        seen = self.columns.observe(one, np.array([value]), np.array([floor]), cfg)
        return list(Verdict)[int(seen.verdict[0])]


class BaselineBook:
    """Baselines keyed by any hashable (comm, op kind, size bucket, metric...).

    Keys whose last item names a family of :data:`FAMILY_RULES` live in that
    family's columns; :meth:`get` and :meth:`find` return a
    :class:`ColumnBaseline` view for them. Families take their rule from
    ``cfg`` (default thresholds when none is given).
    """

    def __init__(self, window: int, cfg: DetectorConfig | None = None) -> None:
        self.window = window
        cfg = cfg or DetectorConfig()
        self.families = {
            name: BaselineColumns(window, rule(cfg))
            for name, rule in FAMILY_RULES.items()
        }
        self._book: dict[tuple[object, ...], RobustBaseline] = {}
        self.holds = np.zeros(0, HOLD_ROW)
        """Each comm's last ``hold_of`` ops and who held them back (``hold_back``)."""

    def get(self, key: tuple[object, ...]) -> RobustBaseline | ColumnBaseline:
        """Return the baseline of ``key``, creating an empty one."""
        columns = self.families.get(str(key[-1]))
        if columns is not None:
            return ColumnBaseline(columns, int(columns.row_of([key])[0]))
        base = self._book.get(key)
        if base is None:
            base = self._book[key] = RobustBaseline(self.window)
        return base

    def get_scalar(self, key: tuple[object, ...]) -> RobustBaseline:
        """Return the ``RobustBaseline`` of ``key`` (not of a family), creating it."""
        base = self.get(key)
        if not isinstance(base, RobustBaseline):
            raise TypeError(f"{key!r} belongs to a column family; feed it in blocks")
        return base

    def find(self, key: tuple[object, ...]) -> RobustBaseline | ColumnBaseline | None:
        """Return the baseline of ``key`` if it exists."""
        columns = self.families.get(str(key[-1]))
        if columns is not None:
            row = columns.rows.get(key)
            return None if row is None else ColumnBaseline(columns, row)
        return self._book.get(key)


def size_bucket(nbytes: int) -> int:
    """Return the power-of-two size bucket of a message (0 for <= 1 byte)."""
    return int(nbytes).bit_length()


def size_buckets(nbytes: np.ndarray) -> np.ndarray:
    """:func:`size_bucket` of each message size: its bit length, exact for every
    int64 (the powers of two at or below ``|n|``)."""
    powers = np.left_shift(np.uint64(1), np.arange(64, dtype=np.uint64))
    magnitude = np.abs(nbytes.astype(np.int64)).astype(np.uint64)
    out: np.ndarray = np.searchsorted(powers, magnitude, side="right")
    return out


K = TypeVar("K")


def outliers(values: dict[K, float], floor: float) -> dict[K, float]:
    """Keys whose value is above ``median + max(4 MAD, floor)`` of all the
    values (two at least), with their excess over the median."""
    if len(values) < PEERS:
        return {}
    arr = np.array(list(values.values()))
    med = float(np.median(arr))
    mad = float(np.median(np.abs(arr - med))) * 1.4826
    cut = med + max(4 * mad, floor)
    return {r: v - med for r, v in values.items() if v > cut}
