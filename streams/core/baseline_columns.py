"""Many robust baselines of one family kept as arrays, updated in rounds.

A 1,024-rank job completes ~19,000 collectives a second, and every one feeds
its op baselines (span, transfer) and one lateness baseline per member: about
90,000 samples a second. One :class:`~mycroft.streams.core.baseline.RobustBaseline`
object per key costs ~20 us of Python per sample, more than the job produces
in real time. :class:`BaselineColumns` holds every key of a family as one row
of a ring buffer and applies a block of samples in *rounds*: round ``j`` takes
the ``j``-th sample of every key at once, so each key still sees its samples
one by one, in order, under exactly the rules of ``RobustBaseline`` (same
verdicts, same learned values, same medians, bit for bit).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass

import numpy as np

from mycroft.streams.core.config import DetectorConfig
from mycroft.streams.core.rows import run_starts

MAD_TO_SIGMA = 1.4826
WARM_SAMPLES = 3
"""Kept samples after which a baseline's median is trusted as a reference."""
WARMUP, NORMAL, HIGH, SEVERE = 0, 1, 2, 3
"""Verdict codes, in the order of :class:`~mycroft.streams.core.baseline.Verdict`."""


@dataclass(frozen=True)
class Rule:
    """How one family judges and fires (see ``detect_slow.observe_collectives``).

    Attributes:
        of: Persistence window, samples (``recent`` and ``last`` hold as many).
        need: Out-of-band samples among the last ``of`` that make a HIGH fire.
        fire_high: Whether a persistent HIGH fires at all (SEVERE always does).
        shift: Whether a sustained shift of the last ``of`` samples fires.
        recur: Whether a far out-of-band sample that recurs fires (an
            intermittent fault, see ``DetectorConfig.recur_need``).
    """

    of: int
    need: int
    fire_high: bool = True
    shift: bool = False
    recur: bool = False


@dataclass(frozen=True)
class Observed:
    """Per-sample outcome of :meth:`BaselineColumns.observe`, in input order.

    Attributes:
        verdict: Verdict code (``WARMUP``..``SEVERE``).
        fired: Whether the sample fires under the family's :class:`Rule`.
        median_before: The key's median before the sample.
        median_after: The key's median after it (NaN unless ``fired``).
    """

    verdict: np.ndarray
    fired: np.ndarray
    median_before: np.ndarray
    median_after: np.ndarray


def sorted_median(s: np.ndarray, n: np.ndarray) -> np.ndarray:
    """Median of the first ``n[i]`` items of each sorted row ``s[i]`` (0.0 when
    ``n[i]`` is 0), with the arithmetic of ``baseline._median``."""
    rows = np.arange(len(s))
    hi = s[rows, n // 2]
    lo = s[rows, np.maximum((n - 1) // 2, 0)]
    out: np.ndarray = np.where(n % 2 == 1, hi, (lo + hi) / 2)
    return np.where(n > 0, out, 0.0)


def row_stats(window: np.ndarray, n: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(median, sigma)`` of each row's first ``n`` slots (sigma = 1.4826 MAD)."""
    width = window.shape[1]
    if len(n) and (n == width).all():  # the steady state: every slot is a sample
        s = np.sort(window, axis=1)
        med = sorted_median(s, n)
        dev = np.sort(np.abs(window - med[:, None]), axis=1)
        return med, MAD_TO_SIGMA * sorted_median(dev, n)
    valid = np.arange(width) < n[:, None]
    s = np.sort(np.where(valid, window, np.inf), axis=1)
    med = sorted_median(s, n)
    dev = np.sort(np.where(valid, np.abs(window - med[:, None]), np.inf), axis=1)
    return med, MAD_TO_SIGMA * sorted_median(dev, n)


class BaselineColumns:
    """Robust median/MAD baselines of one family, one row per key.

    Row state: the learned samples (a ring of ``window``; unused slots are
    never read), how many were learned, rings of the last ``of`` verdicts
    (out of band or not) and values, and with ``rule.recur`` a ring of the
    last ``cfg.recur_of`` "far out of band" flags. Samples judged HIGH or
    SEVERE are not learned, as in ``RobustBaseline``.
    """

    def __init__(self, window: int, rule: Rule) -> None:
        self.window, self.rule = window, rule
        self.rows: dict[Hashable, int] = {}
        self.values = np.zeros((0, window))
        self.learned = np.zeros(0, np.int64)
        self.seen = np.zeros(0, np.int64)
        self.recent = np.zeros((0, rule.of), bool)
        self.last = np.zeros((0, rule.of))
        self.far = np.zeros((0, 0), bool)  # sized on first use (cfg.recur_of)
        self._med = np.zeros(0)  # cached stats, valid while ``_fresh``
        self._sigma = np.zeros(0)
        self._fresh = np.zeros(0, bool)
        # Rows of keys (a, b, name) by code (code of a) << 32 | b, sorted;
        # the last code is a sentinel above all (see rows_of_pairs).
        self._a_code: dict[int, int] = {}
        self._pair_codes = np.array([np.iinfo(np.int64).max], np.int64)
        self._pair_rows = np.array([-1], np.int64)

    def restore_state(self, state: dict[str, object]) -> None:
        """Restore from :meth:`snapshot_state`."""
        self.__dict__.update(state)

    def snapshot_state(self) -> dict[str, object]:
        """Snapshot state (worker snapshots) without the stats cache."""
        state = dict(self.__dict__)
        state["_fresh"] = np.zeros(len(self._fresh), bool)
        return state

    def row_of(self, keys: Sequence[Hashable]) -> np.ndarray:
        """Return the row of each key, adding rows for new keys."""
        rows = self.rows
        for k in keys:
            if k not in rows:
                rows[k] = len(rows)
        grow = len(rows) - len(self.learned)
        if grow > 0:
            self.values = np.vstack([self.values, np.zeros((grow, self.window))])
            self.learned = np.concatenate([self.learned, np.zeros(grow, np.int64)])
            self.seen = np.concatenate([self.seen, np.zeros(grow, np.int64)])
            self.recent = np.vstack([self.recent, np.zeros((grow, self.rule.of), bool)])
            self.last = np.vstack([self.last, np.zeros((grow, self.rule.of))])
            width = self.far.shape[1]
            self.far = np.vstack([self.far, np.zeros((grow, width), bool)])
            self._med = np.concatenate([self._med, np.zeros(grow)])
            self._sigma = np.concatenate([self._sigma, np.zeros(grow)])
            self._fresh = np.concatenate([self._fresh, np.zeros(grow, bool)])
        return np.array([rows[k] for k in keys], np.int64)

    def rows_of_pairs(self, a: np.ndarray, b: np.ndarray, name: str) -> np.ndarray:
        """Return the rows of the distinct keys ``(a[i], b[i], name)``, as
        :meth:`row_of` does (new keys in input order), looking known pairs up
        by number: a block of lateness samples holds ~10,000 (comm, rank)
        pairs, and a tuple and a dictionary lookup each was most of its cost.

        Args:
            a: Unsigned 64-bit integers (communicator ids).
            b: Integers in ``[0, 2**32)`` (ranks); others take the tuple path.
        """
        if not len(b) or b.min() < 0 or b.max() >= 1 << 32:
            keys = zip(a.tolist(), b.tolist(), strict=True)
            return self.row_of([(x, y, name) for x, y in keys])
        uniq, inv = np.unique(a, return_inverse=True)
        codes = self._a_code
        a_code = [codes.setdefault(x, len(codes)) for x in uniq.tolist()]
        code = (np.array(a_code, np.int64)[inv.ravel()] << 32) | b.astype(np.int64)
        at = np.searchsorted(self._pair_codes, code)
        known = self._pair_codes[at] == code
        rows = self._pair_rows[at]
        if not known.all():
            fresh = np.flatnonzero(~known)
            keys = zip(a[fresh].tolist(), b[fresh].tolist(), strict=True)
            rows[fresh] = self.row_of([(x, y, name) for x, y in keys])
            all_codes = np.concatenate([self._pair_codes, code[fresh]])
            all_rows = np.concatenate([self._pair_rows, rows[fresh]])
            by_code = np.argsort(all_codes, kind="stable")
            self._pair_codes, self._pair_rows = all_codes[by_code], all_rows[by_code]
        return rows

    def count(self, row: int) -> int:
        """Samples the row's baseline holds (at most ``window``)."""
        return int(min(self.learned[row], self.window))

    def warm(self, rows: np.ndarray) -> np.ndarray:
        """Whether each row holds :data:`WARM_SAMPLES` samples or more."""
        out: np.ndarray = np.minimum(self.learned[rows], self.window) >= WARM_SAMPLES
        return out

    def stats(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(median, sigma)`` of each row's kept samples (rows distinct)."""
        stale = rows[~self._fresh[rows]]
        if len(stale):
            n = np.minimum(self.learned[stale], self.window)
            self._med[stale], self._sigma[stale] = row_stats(self.values[stale], n)
            self._fresh[stale] = True
        return self._med[rows], self._sigma[rows]

    def observe(
        self,
        rows: np.ndarray,
        values: np.ndarray,
        floors: np.ndarray,
        cfg: DetectorConfig,
    ) -> Observed:
        """Judge, remember and (if in band) learn each sample, in order per row.

        Args:
            rows: Row of each sample (:meth:`row_of`); a row may repeat.
            values: The samples.
            floors: Absolute margin above the median, per sample.
            cfg: Thresholds.
        """
        n = len(rows)
        out = Observed(
            np.zeros(n, np.int8),
            np.zeros(n, bool),
            np.zeros(n),
            np.full(n, np.nan),
        )
        if not n:
            return out
        order = np.argsort(rows, kind="stable")
        sorted_rows = rows[order]
        first = np.flatnonzero(run_starts(sorted_rows))
        turn = np.empty(n, np.int64)
        turn[order] = np.arange(n) - np.repeat(first, np.diff(np.r_[first, n]))
        by_turn = np.argsort(turn, kind="stable")
        cuts = np.searchsorted(turn[by_turn], np.arange(int(turn.max()) + 2))
        for j in range(len(cuts) - 1):
            at = by_turn[cuts[j] : cuts[j + 1]]
            self._round(rows[at], values[at], floors[at], cfg, at, out)
        return out

    def _round(  # noqa: PLR0913, PLR0917 - one step of observe, private
        self,
        rows: np.ndarray,
        v: np.ndarray,
        floor: np.ndarray,
        cfg: DetectorConfig,
        at: np.ndarray,
        out: Observed,
    ) -> None:
        """Apply one sample to each of ``rows`` (distinct)."""
        rule, of = self.rule, self.rule.of
        med, sigma = self.stats(rows)
        warm = np.minimum(self.learned[rows], self.window) >= cfg.warmup_samples
        band = np.maximum(
            np.maximum(med * cfg.slow_ratio_min, med + cfg.slow_mad_k * sigma),
            med + floor,
        )
        high = warm & (v > band)
        severe_line = np.maximum(med * cfg.severe_ratio, med + cfg.severe_extra_s * 1e9)
        severe = high & (v > severe_line)
        slot = self.seen[rows] % of
        self.recent[rows, slot] = high
        self.last[rows, slot] = v
        self.seen[rows] += 1
        fired = severe.copy()
        if rule.fire_high:
            fired |= high & (self.recent[rows].sum(axis=1) >= rule.need)
        if rule.recur:
            fired |= self._recurs(rows, v, high, med, cfg)
        if rule.shift:
            line = np.maximum(
                np.maximum(med * cfg.slow_ratio_min, med + cfg.slow_shift_k * sigma),
                med + floor,
            )
            full = warm & (self.seen[rows] >= of)
            last_med = sorted_median(
                np.sort(self.last[rows], axis=1), np.full(len(rows), of)
            )
            fired |= full & (v > line) & (last_med > line)
        keep = ~high
        learn = rows[keep]
        self.values[learn, self.learned[learn] % self.window] = v[keep]
        self.learned[learn] += 1
        self._fresh[learn] = False
        out.verdict[at] = np.where(
            warm, np.where(high, np.where(severe, SEVERE, HIGH), NORMAL), WARMUP
        )
        out.fired[at] = fired
        out.median_before[at] = med
        if fired.any():  # rare: the median the anomaly reports
            after = np.where(keep[fired], self.stats(rows[fired])[0], med[fired])
            out.median_after[at[fired]] = after

    def _recurs(
        self,
        rows: np.ndarray,
        v: np.ndarray,
        high: np.ndarray,
        med: np.ndarray,
        cfg: DetectorConfig,
    ) -> np.ndarray:
        """Record whether each sample is far out of band; return whether it
        is so and is the ``cfg.recur_need``-th such among its row's last
        ``cfg.recur_of`` samples (``seen`` already counts it)."""
        if self.far.shape[1] != cfg.recur_of:
            self.far = np.zeros((len(self.learned), cfg.recur_of), bool)
        line = np.maximum(med * cfg.recur_ratio, med + cfg.recur_extra_s * 1e9)
        far = high & (v > line)
        self.far[rows, (self.seen[rows] - 1) % cfg.recur_of] = far
        out: np.ndarray = far & (self.far[rows].sum(axis=1) >= cfg.recur_need)
        return out
