"""A NIC port that keeps going down: an anomaly from port counters alone.

A marginal link retrains in milliseconds, over and over: each retrain
stalls the transfers on it too briefly for any op to look slow, but the
port's ``link_downed`` / ``link_error_recovery`` counters grow in heartbeat
after heartbeat. A port with events in ``port_flap_need`` heartbeats of the
last ``port_flap_window_s`` on a NIC that ranks of the job use is a slowdown
of those ranks; root cause names the NIC (``rca_ports``). NICs no rank uses
(storage, management) are not the job's.
"""

from __future__ import annotations

from mycroft.schemas.records import Anomaly
from mycroft.schemas.vocab import FaultKind
from mycroft.streams.core.detect import DetectContext, new_anomaly


def detect_port_flaps(ctx: DetectContext, now_ns: int) -> list[Anomaly]:
    """Return a SLOWDOWN anomaly per flapping NIC that ranks of the job use."""
    cfg = ctx.cfg
    window_ns = int(cfg.port_flap_window_s * 1e9)
    out: list[Anomaly] = []
    for host, nic, start_ns, beats in ctx.store.ports.flapping(
        now_ns, window_ns, cfg.port_flap_need
    ):
        ranks = nic_ranks(ctx, host, nic)
        if not ranks:
            continue
        comms = sorted({c for r in ranks for c in ctx.topo.comms_of(r)})
        out.append(
            new_anomaly(
                ctx,
                "port_flap",
                f"{host}:{nic}:{start_ns}",
                FaultKind.SLOWDOWN,
                tuple(comms),
                ranks,
                start_ns,
                now_ns,
                f"a port of NIC {nic} on {host} went down in {beats} heartbeats "
                f"of the last {cfg.port_flap_window_s:g} s (ranks "
                f"{', '.join(map(str, ranks))} send through it)",
                score=float(beats),
            )
        )
    return out


def nic_ranks(ctx: DetectContext, host: str, nic: str) -> tuple[int, ...]:
    """Return the job's ranks behind ``nic`` of ``host``, sorted."""
    topo = ctx.topo
    return tuple(r for r in topo.ranks_on_host(host) if topo.nic_key(r) == (host, nic))
