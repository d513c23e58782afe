"""What resolved faults do to the physics, as vectorised queries.

Every query takes arrays of ranks (and times: the op's issue time, seconds
since start) and returns multipliers, extra latencies or adjusted intervals.
A fault is active for an op when the op was issued inside its window.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from mycroft.producers.sim.config import Noise
from mycroft.producers.sim.faults import Fault
from mycroft.producers.sim.layout import Layout


@dataclass(frozen=True)
class Window:
    """An effect on ``mask`` ranks during ``[t0_s, t1_s)``."""

    mask: np.ndarray
    t0_s: float
    t1_s: float
    value: float = 1.0
    flag: bool = False

    def hit(self, ranks: np.ndarray, t: np.ndarray) -> np.ndarray:
        """Which (rank, time) pairs fall inside the window."""
        inside: np.ndarray = self.mask[ranks] & (t >= self.t0_s) & (t < self.t1_s)
        return inside


class Effects:
    """Faults compiled to windows and death times over global ranks."""

    def __init__(
        self,
        faults: tuple[Fault, ...],
        layout: Layout,
        duration_s: float,
        rng: np.random.Generator,
    ) -> None:
        n = layout.nranks
        self.compute: list[Window] = []
        self.copy: list[Window] = []
        self.rate: list[Window] = []
        self.lag: list[Window] = []
        self.pcie: list[Window] = []
        self.pauses: list[Window] = []
        self.retrains: list[Window] = []
        self.gpu_dead = np.full(n, np.inf)
        self.proc_dead = np.full(n, np.inf)
        self.stalls: list[Fault] = []
        self.mismatches: list[Fault] = []
        self.cpu_pauses: list[tuple[int, float, float]] = []
        self.noise_events: list[tuple[str, int, float, float]] = []
        for fault in faults:
            mask = np.zeros(n, dtype=bool)
            mask[list(fault.ranks)] = True
            self._add(fault, mask, duration_s, rng)

    def _add(
        self, f: Fault, mask: np.ndarray, duration_s: float, rng: np.random.Generator
    ) -> None:
        t0, t1, sev = f.at_s, f.end_s, f.severity
        name = f.name
        if name in ("gpu-power-cap", "gpu-background-load"):
            slow = 1.0 / (1.0 - sev)
            self.compute.append(Window(mask, t0, t1, slow))
            copy = slow if name == "gpu-power-cap" else 1.0 / (1.0 - sev / 2)
            self.copy.append(Window(mask, t0, t1, copy))
        elif name == "pcie-downgrade":
            self.copy.append(Window(mask, t0, t1, 1.0 / (1.0 - sev), flag=True))
            self.pcie.append(Window(mask, t0, t1, 1.0 - sev))
        elif name == "nic-bandwidth":
            self.rate.append(Window(mask, t0, t1, 1.0 - sev, flag=True))
        elif name == "net-background-traffic":
            self.lag.append(Window(mask, t0, t1, sev * 1e-3))
        elif name == "switch-congestion":
            self.rate.append(Window(mask, t0, t1, 1.0 - sev))
            self.lag.append(Window(mask, t0, t1, sev * 0.1e-3))
        elif name == "nic-down":
            self.pauses.append(Window(mask, t0, t1))
        elif name in ("link-flap", "port-flap"):
            self._flaps(f, mask, duration_s)
        elif name == "proxy-delay":
            self._proxy_stalls(f, mask, duration_s, rng)
        elif name == "gpu-hang":
            self.gpu_dead[mask] = np.minimum(self.gpu_dead[mask], t0)
        elif name == "process-crash":
            self.proc_dead[mask] = np.minimum(self.proc_dead[mask], t0)
            self.gpu_dead[mask] = np.minimum(self.gpu_dead[mask], t0)
        elif name == "host-stall":
            self.stalls.append(f)
        elif name == "collective-mismatch":
            self.mismatches.append(f)

    def add_noise(
        self, noise: Noise, layout: Layout, duration_s: float, rng: np.random.Generator
    ) -> None:
        """Draw the benign noise events of a run (``noise_events`` lists them:
        kind, rank, start, end in reference seconds)."""
        n = layout.nranks
        kinds = (
            ("gc-pause", noise.gc_pauses_per_min, noise.gc_pause_s),
            ("proxy-hiccup", noise.proxy_hiccups_per_min, noise.proxy_hiccup_s),
            ("wire-burst", noise.wire_bursts_per_min, noise.wire_burst_s),
        )
        for kind, per_min, (lo, hi) in kinds:
            count = int(rng.poisson(per_min * duration_s / 60.0))
            starts = np.sort(rng.uniform(0.0, duration_s, count))
            ranks = rng.integers(0, n, count)
            lengths = rng.uniform(lo, hi, count)
            for r, t0, d in zip(
                ranks.tolist(), starts.tolist(), lengths.tolist(), strict=True
            ):
                self.noise_events.append((kind, r, t0, t0 + d))
                mask = np.zeros(n, dtype=bool)
                if kind == "wire-burst":
                    mask[layout.nic_of == layout.nic_of[r]] = True
                    self.rate.append(Window(mask, t0, t0 + d, 0.5))
                elif kind == "proxy-hiccup":
                    mask[r] = True
                    self.pauses.append(Window(mask, t0, t0 + d, flag=True))
                else:
                    self.cpu_pauses.append((r, t0, t0 + d))

    def _flaps(self, f: Fault, mask: np.ndarray, duration_s: float) -> None:
        period, down = f.param("period"), f.param("down")
        t, end = f.at_s, min(f.end_s, duration_s)
        before = len(self.pauses)
        while t < end:
            self.pauses.append(Window(mask, t, t + min(down, period)))
            t += max(period, 1e-3)
        if f.name == "port-flap":
            # Brief retrains (each one a down and a recovery on the port)
            # and retransmissions: the link runs a little slower.
            self.retrains += self.pauses[before:]
            self.rate.append(Window(mask, f.at_s, f.end_s, 1.0 - f.severity))

    def _proxy_stalls(
        self, f: Fault, mask: np.ndarray, duration_s: float, rng: np.random.Generator
    ) -> None:
        stall, every = f.param("stall"), f.param("every")
        t, end = f.at_s, min(f.end_s, duration_s)
        while t < end:
            self.pauses.append(Window(mask, t, t + stall, flag=True))
            t += stall + every * float(rng.uniform(0.5, 1.5))

    def port_state(
        self, ranks: np.ndarray, t: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """What the port counters of each rank's NIC show at reference time
        ``t``: how many link outages (nic-down, link-flap, port-flap; a proxy
        stall is no port event) have begun, whether one is going on, and how
        many port-flap retrains have completed (``link_recovered``)."""
        downs = np.zeros(ranks.shape, dtype=np.int64)
        down_now = np.zeros(ranks.shape, dtype=bool)
        for w in self.pauses:
            if w.flag:
                continue
            on = w.mask[ranks] & (t >= w.t0_s)
            downs += on
            down_now |= on & (t < w.t1_s)
        recovered = np.zeros(ranks.shape, dtype=np.int64)
        for w in self.retrains:
            recovered += w.mask[ranks] & (t >= w.t1_s)
        return downs, down_now, recovered

    def compute_mult(self, ranks: np.ndarray, t: np.ndarray) -> np.ndarray:
        """Multiplier (>= 1) on compute time."""
        out = np.ones(ranks.shape)
        for w in self.compute:
            out = np.where(w.hit(ranks, t), out * w.value, out)
        return out

    def copy_mult(
        self, ranks: np.ndarray, t: np.ndarray, net: np.ndarray
    ) -> np.ndarray:
        """Multiplier (>= 1) on GPU copy time; PCIe windows hit network copies only."""
        out = np.ones(ranks.shape)
        for w in self.copy:
            hit = w.hit(ranks, t) & (net | (not w.flag))
            out = np.where(hit, out * w.value, out)
        return out

    def rate_frac(self, src: np.ndarray, dst: np.ndarray, t: np.ndarray) -> np.ndarray:
        """Fraction (<= 1) of the NIC rate left for a src -> dst network transfer.

        Windows flagged egress-only (a capped NIC) slow the sender side only.
        """
        out = np.ones(src.shape)
        for w in self.rate:
            hit = w.hit(src, t) if w.flag else w.hit(src, t) | w.hit(dst, t)
            out = np.where(hit, out * w.value, out)
        return out

    def pcie_frac(self, ranks: np.ndarray, t: np.ndarray) -> np.ndarray:
        """Fraction (<= 1) of the PCIe rate left between a GPU and its NIC."""
        out = np.ones(ranks.shape)
        for w in self.pcie:
            out = np.where(w.hit(ranks, t), out * w.value, out)
        return out

    def lag_s(self, src: np.ndarray, dst: np.ndarray, t: np.ndarray) -> np.ndarray:
        """Extra completion delay per ring step of a network transfer, seconds."""
        out = np.zeros(src.shape)
        for w in self.lag:
            out = np.where(w.hit(src, t) | w.hit(dst, t), out + w.value, out)
        return out

    def pause(
        self,
        tb: np.ndarray,
        te: np.ndarray,
        src: np.ndarray,
        dst: np.ndarray,
        net: np.ndarray,
        *,
        proxy: bool | None = None,
    ) -> tuple[np.ndarray, ...]:
        """Stretch transmit intervals ``[tb, te]`` over NIC and proxy outages
        (``proxy``: True, proxy stalls only; False, NIC outages only; None,
        both); return them and the outage ``[hb, he]`` inside each stretched
        interval, where nothing moves (NaN: none; the last of several).

        A window with ``t1 = inf`` (a NIC that never comes back) makes every
        interval it touches end at ``inf``.
        """
        hb = np.full(np.shape(tb), np.nan)
        he = hb.copy()
        if not self.pauses:
            return tb, te, hb, he
        lo, hi = float(tb.min()), float(te.max())
        for w in self.pauses:
            if w.t0_s >= hi or w.t1_s <= lo or proxy not in (None, w.flag):
                continue
            who = w.mask[src] if w.flag else w.mask[src] | w.mask[dst]
            hit = who & net & (tb < w.t1_s) & (te > w.t0_s)
            if not hit.any():
                continue
            inside = tb >= w.t0_s
            if math.isinf(w.t1_s):
                te = np.where(hit, np.inf, te)
                tb = np.where(hit & inside, np.inf, tb)
                continue
            shift = np.where(inside, w.t1_s - tb, w.t1_s - w.t0_s)
            tb = np.where(hit & inside, w.t1_s, tb)
            te = np.where(hit, te + shift, te)
            within = hit & ~inside
            hb = np.where(within, w.t0_s, hb)
            he = np.where(within, w.t1_s, he)
        return tb, te, hb, he

    def take_stall(self, ranks: np.ndarray, issue: np.ndarray) -> np.ndarray:
        """Delay the first op a stalled rank issues at or after the stall;
        an op issued during a GC pause of its rank waits for the pause's end."""
        for r, t0, t1 in self.cpu_pauses:
            hit = (ranks == r) & (issue >= t0) & (issue < t1)
            if hit.any():
                issue = np.where(hit, t1, issue)
        for f in self.stalls:
            hit = (ranks == f.rank) & (issue >= f.at_s)
            if hit.any():
                issue = np.where(hit, issue + f.duration_s, issue)
                self.stalls = [s for s in self.stalls if s is not f]
        return issue

    def take_mismatch(self, ranks: np.ndarray, issue: np.ndarray) -> np.ndarray:
        """Culprit mask ``(G, n)`` of a mismatched op (one rank issues other bytes)."""
        culprit = np.zeros(ranks.shape, dtype=bool)
        for f in self.mismatches:
            hit = (ranks == f.rank) & (issue >= f.at_s)
            if hit.any():
                culprit |= hit
                self.mismatches = [m for m in self.mismatches if m is not f]
        return culprit
