"""RDMA NIC port state from Linux sysfs, for the heartbeat.

For every device under ``/sys/class/infiniband`` and every ``ports/<n>``
of it, reads ``state`` (``4: ACTIVE``), ``counters/link_downed`` and
``counters/link_error_recovery``. The analyzer compares them across
heartbeats to tell which end of a NIC pair went down.

These counters are 8 bits wide in the IB PMA PortCounters attribute and
saturate at 255: an increase is evidence that the link went down, but a
saturated counter stays at 255 and says nothing more.

Reading never raises. Each kind of problem is logged once per ``warned`` set,
so an agent reading every second does not repeat the same warning.
"""

from __future__ import annotations

import logging
from pathlib import Path

from mycroft.schemas.records import NicPort

log = logging.getLogger(__name__)

SYSFS_ROOT = "/sys/class/infiniband"
UNREADABLE = -1
PORT_STATES = frozenset({"NOP", "DOWN", "INIT", "ARMED", "ACTIVE", "ACTIVE_DEFER"})
_HINT = "check that the agent may read it, or set nic_sysfs='' to stop reading NICs"


def read_ports(
    root: Path | str = SYSFS_ROOT, warned: set[str] | None = None
) -> tuple[NicPort, ...]:
    """Every port of every RDMA device under ``root``, sorted by (nic, port).

    A missing ``root``, or ``""``, gives ``()``. A counter that cannot be read or parsed
    is ``-1``. A port whose ``state`` cannot be read or is not a known IB port
    state is left out: the boolean ``up`` has no "unknown", and ``up=False``
    would be taken as evidence that the port went down.

    Args:
        root: the sysfs class folder, ``/sys/class/infiniband`` on a host.
        warned: problem kinds already logged; pass the same set on every
            call to log each kind once. ``None``: once per call.
    """
    if root == "":
        return ()
    seen = set() if warned is None else warned
    base = Path(root)
    try:
        devices = sorted(base.iterdir())
    except FileNotFoundError:
        return ()
    except OSError as exc:
        _warn(seen, "root", "cannot list RDMA devices in %s: %s; %s", base, exc, _HINT)
        return ()
    out: list[NicPort] = []
    for device in devices:
        for number, port_dir in _ports(device, seen):
            up = _state(port_dir / "state", seen)
            if up is None:
                continue
            counters = port_dir / "counters"
            out.append(
                NicPort(
                    device.name,
                    number,
                    up,
                    _counter(counters / "link_downed", seen),
                    _counter(counters / "link_error_recovery", seen),
                )
            )
    return tuple(sorted(out, key=lambda p: (p.nic, p.port)))


def _ports(device: Path, warned: set[str]) -> list[tuple[int, Path]]:
    """``(port number, folder)`` of each numbered folder in ``device/ports``."""
    try:
        entries = list((device / "ports").iterdir())
    except OSError as exc:
        _warn(warned, "ports", "RDMA device %s has no readable ports: %s", device, exc)
        return []
    out: list[tuple[int, Path]] = []
    for entry in entries:
        try:
            out.append((int(entry.name), entry))
        except ValueError:
            _warn(warned, "port-name", "ignoring %s: not a port number", entry)
    return out


def _state(path: Path, warned: set[str]) -> bool | None:
    """Whether the port is ACTIVE; ``None`` when its state is unknown."""
    try:
        text = path.read_text("ascii")
    except (OSError, ValueError) as exc:
        _warn(
            warned, "state", "cannot read %s (%s), port left out; %s", path, exc, _HINT
        )
        return None
    name = text.partition(":")[2].strip() if ":" in text else text.strip()
    if name not in PORT_STATES:
        _warn(
            warned,
            "state",
            "%s holds %r, not an IB port state; port left out",
            path,
            text,
        )
        return None
    return name == "ACTIVE"


def _counter(path: Path, warned: set[str]) -> int:
    """The counter's value, or ``UNREADABLE`` when it cannot be read or parsed."""
    try:
        value = int(path.read_text("ascii").strip())
    except (OSError, ValueError) as exc:
        _warn(
            warned,
            "counter",
            "cannot read %s (%s), reported as -1; %s",
            path,
            exc,
            _HINT,
        )
        return UNREADABLE
    if value < 0:
        _warn(warned, "counter", "%s holds %d, reported as -1", path, value)
        return UNREADABLE
    return value


def _warn(warned: set[str], kind: str, msg: str, *args: object) -> None:
    if kind in warned:
        return
    warned.add(kind)
    text = msg % args
    log.warning("%s (further problems of this kind are not logged)", text)
