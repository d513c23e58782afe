"""Wait chains and host/device lateness of Flight Recorder dumps (torch 2.13
format). Wait chains: 8 ranks, the world group ``0`` and sub-groups ``1``
(ranks 0-3) and ``2`` (ranks 4-7)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mycroft.streams import flight_recorder as fr
from mycroft.streams import fr_lateness
from tests.unit.torch.frdumps import MS, T0, entry, healthy, write

GROUPS = {"0": list(range(8)), "1": [0, 1, 2, 3], "2": [4, 5, 6, 7]}


def sub(seq: int, t_ms: float, pg: str, **kw: Any) -> dict[str, Any]:
    return entry(seq, t_ms, "all_gather", process_group=(pg, f"pg{pg}"), **kw)


def history(rank: int) -> list[dict[str, Any]]:
    """10 steps: a world all-reduce then the rank's sub-group all-gather."""
    pg = "1" if rank < 4 else "2"
    rows = []
    for i in range(1, 11):
        rows.append(entry(i, i * 100 + rank * 0.1))
        rows.append(sub(i, i * 100 + 50 + rank * 0.1, pg))
    return rows


def test_crash_in_a_subgroup_is_followed_from_the_world(tmp_path: Path) -> None:
    """Rank 3 died: ranks 0-2 sit in group 1's all-gather #11, so they never
    issue the world's all-reduce #11 that ranks 4-7 wait in."""
    for r in range(8):
        if r == 3:
            continue
        rows = history(r)
        if r < 4:
            rows.append(sub(11, 1150 + r * 0.1, "1", retired=False, state="started"))
        else:
            rows.append(entry(11, 1100 + r * 0.1, retired=False, state="started"))
        write(tmp_path, r, rows, GROUPS)
    doc = fr.analyze(fr.load_dir(tmp_path, world_size=8))
    best = doc["root_causes"][0]
    assert (best["rank"], best["kind"], best["component"]) == (3, "hang", "process")
    assert "all_gather #11 of group 1" in best["reason"]
    assert "waiting: ranks [0, 1, 2, 4, 5, 6, 7]" in best["reason"]
    assert all(r["rank"] == 3 for r in doc["root_causes"])  # victims not named


def test_idle_rank_behind_a_subgroup_is_host(tmp_path: Path) -> None:
    """Rank 6 never issued group 2's all-gather #11: ranks 4, 5, 7 wait in
    it, ranks 0-3 wait in the world's #12 that 4-7 never reached."""
    for r in range(8):
        rows = history(r)
        if r < 4:
            rows.append(sub(11, 1150 + r * 0.1, "1"))
            rows.append(entry(12, 1200 + r * 0.1, retired=False, state="started"))
        else:
            rows.append(entry(11, 1100 + r * 0.1))
            if r != 6:
                rows.append(
                    sub(11, 1150 + r * 0.1, "2", retired=False, state="started")
                )
        write(tmp_path, r, rows, GROUPS)
    doc = fr.analyze(fr.load_dir(tmp_path))
    best = doc["root_causes"][0]
    assert (best["rank"], best["kind"], best["component"]) == (6, "hang", "host")
    assert "waiting: ranks [0, 1, 2, 3, 4, 5, 7]" in best["reason"]


def test_ops_in_flight_at_a_healthy_exit_are_no_wait(tmp_path: Path) -> None:
    """Dumped 4 s after the last entry, but rank 1's last op was issued just
    before its own dump: younger than the shortest hang, it waits on nobody."""
    for r in range(4):
        rows = healthy(20, r)
        if r != 1:
            rows.append(entry(21, 1050 + r * 0.1, retired=False))
        write(tmp_path, r, rows)
    d = fr.load_dir(tmp_path)
    for r in d.mtime_ns:  # every dump written 1 s after the last issue
        d.mtime_ns[r] = d.entries[0][-1].created_ns + 1_000_000_000
    assert fr.fr_waits.with_chain(d, [], "job") == []


def straggler(tmp_path: Path, issue_ms: float, start_ms: float) -> fr.FrDumps:
    """4 ranks x 40 all-reduces; from op 21 on rank 2 issues ``issue_ms``
    late and its ops start ``start_ms`` after being issued."""
    for r in range(4):
        rows = []
        for i in range(1, 41):
            late = r == 2 and i > 20
            t = i * 50 + r * 0.1 + (issue_ms if late else 0)
            start = T0 + int((t + (start_ms if late else 0.05)) * MS)
            rows.append(entry(i, t, time_discovered_started_ns=start))
        write(tmp_path, r, rows)
    return fr.load_dir(tmp_path)


def test_straggler_that_issues_late_is_host(tmp_path: Path) -> None:
    d = straggler(tmp_path, issue_ms=300, start_ms=0.05)
    best = fr.analyze(d)["root_causes"][0]
    assert (best["rank"], best["kind"], best["component"]) == (2, "slowdown", "host")
    assert "started as soon as issued" in best["reason"]


def test_straggler_that_starts_late_is_gpu(tmp_path: Path) -> None:
    d = straggler(tmp_path, issue_ms=0, start_ms=300)
    got = fr_lateness.rank_lateness(d, 2)
    assert got is not None and got.component.value == "gpu"
    assert fr_lateness.rank_lateness(d, 1) is None


def test_a_mismatch_stays_ahead_of_the_waits_it_caused(tmp_path: Path) -> None:
    """gloo aborts rank 0 on meeting rank 1's larger all-reduce: rank 0
    leaves no dump, ranks 2 and 3 wait on it. The mismatch is the cause."""
    for r in (1, 2, 3):
        big = {"input_sizes": [[16]], "output_sizes": [[16]]} if r == 1 else {}
        odd = entry(21, 1050 + r * 0.1, retired=False, state="started", **big)
        write(tmp_path, r, [*healthy(20, r), odd])
    rows = fr.analyze(fr.load_dir(tmp_path, world_size=4))["root_causes"]
    assert (rows[0]["rank"], rows[0]["kind"], rows[0]["component"]) == (
        1,
        "mismatch",
        "config",
    )
    assert (0, "process", False) in {
        (r["rank"], r["component"], r["best"]) for r in rows
    }


def recv(rank: int, src: int, t_ms: float, **kw: Any) -> dict[str, Any]:
    name = f"recv {rank}<-{src}"
    return entry(0, t_ms, is_p2p=True, p2p_seq_id=1, collective_seq_id=20, **kw) | {
        "profiling_name": f"nccl:{name}"
    }


def test_a_recv_is_followed_to_its_peer(tmp_path: Path) -> None:
    """Ranks 0 and 3 wait in the world's #21; rank 1 never issued it, sitting
    in a recv from rank 2, which is idle: rank 2 is named, not rank 1."""
    for r in range(4):
        rows = healthy(20, r)
        if r in (0, 3):
            rows.append(entry(21, 1050 + r * 0.1, retired=False, state="started"))
        if r == 1:
            rows.append(recv(1, 2, 1040, retired=False, state="started"))
        write(tmp_path, r, rows)
    doc = fr.analyze(fr.load_dir(tmp_path))
    best = doc["root_causes"][0]
    assert (best["rank"], best["kind"], best["component"]) == (2, "hang", "host")
    assert "waiting: ranks [0, 1, 3]" in best["reason"]
    assert {r["rank"] for r in doc["root_causes"]} == {2}
