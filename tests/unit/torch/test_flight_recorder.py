"""Flight Recorder import on hand-made dumps: formats, bad files, each fault."""

from __future__ import annotations

import json
import pickle
from pathlib import Path
from typing import Any

import pytest

from mycroft.streams import flight_recorder as fr

T0 = 1_800_000_000_000_000_000
MS = 1_000_000


def entry(seq: int, t_ms: float, pg: str = "0", size: int = 8, retired: bool = True):
    return {
        "record_id": seq,
        "pg_id": int(pg),
        "process_group": (pg, "default_pg" if pg == "0" else "dp"),
        "collective_seq_id": seq,
        "profiling_name": "gloo:all_reduce",
        "time_created_ns": T0 + int(t_ms * MS),
        "input_sizes": [[size]],
        "input_dtypes": ["Float"],
        "retired": retired,
        "state": "scheduled",
        "time_discovered_completed_ns": None,
        "is_p2p": False,
    }


def dump(entries: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "version": "2.10",
        "pg_config": {"": {"name": "", "desc": "", "ranks": "[]"}},  # gloo's
        "pg_status": {},
        "entries": entries,
    }


def write(folder: Path, rank: int, doc: dict[str, Any], fmt: str = "pickle") -> None:
    folder.mkdir(exist_ok=True)
    path = folder / f"rank_{rank}"
    if fmt == "json":
        path.write_text(json.dumps(doc))
    else:
        path.write_bytes(pickle.dumps(doc))


def healthy(n: int, rank: int, late_from: int = 10**9, late_ms: float = 0) -> list:
    out = []
    for i in range(1, n + 1):
        t = i * 50 + (late_ms * (i - late_from + 1) if i >= late_from else 0)
        out.append(entry(i, t + rank * 0.1))
    return out


def set_mtime(folder: Path, t_ms: float) -> None:
    import os  # noqa: PLC0415

    for f in folder.iterdir():
        ns = T0 + int(t_ms * MS)
        os.utime(f, ns=(ns, ns))


@pytest.mark.parametrize("fmt", ["pickle", "json"])
def test_stall_names_the_rank_that_never_arrived(tmp_path: Path, fmt: str) -> None:
    for r in range(4):
        rows = healthy(20, r)
        if r != 2:
            rows.append(entry(21, 21 * 50, retired=False))
        write(tmp_path, r, dump(rows), fmt)
    set_mtime(tmp_path, 21 * 50 + 4000)
    doc = fr.analyze(fr.load_dir(tmp_path))
    best = doc["root_causes"][0]
    assert (best["rank"], best["kind"], best["component"]) == (2, "hang", "host")
    assert doc["flight_recorder"]["blocked"][0]["not_arrived"] == [2]


def test_missing_dump_is_named_when_peers_wait(tmp_path: Path) -> None:
    for r in range(3):
        write(tmp_path, r, dump([*healthy(20, r), entry(21, 1050, retired=False)]))
    set_mtime(tmp_path, 1060)  # dumped at once: no time evidence of a hang
    doc = fr.analyze(fr.load_dir(tmp_path, world_size=4))
    assert doc["flight_recorder"]["missing"] == [3]
    best = doc["root_causes"][0]
    assert (best["rank"], best["component"], best["kind"]) == (3, "process", "hang")


def test_mismatch_names_the_odd_size(tmp_path: Path) -> None:
    for r in range(4):
        write(
            tmp_path,
            r,
            dump([*healthy(20, r), entry(21, 1050, size=16 if r == 1 else 8)]),
        )
    doc = fr.analyze(fr.load_dir(tmp_path))
    best = doc["root_causes"][0]
    assert (best["rank"], best["kind"], best["component"]) == (1, "mismatch", "config")


def test_straggler_from_late_arrivals(tmp_path: Path) -> None:
    for r in range(4):
        rows = [
            entry(i, i * 50 + r * 0.1 + (300 if r == 2 and i > 20 else 0))
            for i in range(1, 31)
        ]
        # others end when rank 2 arrives: their next op is issued after it
        write(tmp_path, r, dump(rows))
    doc = fr.analyze(fr.load_dir(tmp_path))
    best = doc["root_causes"][0]
    assert (best["rank"], best["kind"], best["component"]) == (2, "slowdown", "host")


def test_bad_files_are_reported_not_fatal(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for r in range(4):
        write(tmp_path, r, dump(healthy(5, r)))
    (tmp_path / "rank_1").write_bytes((tmp_path / "rank_1").read_bytes()[:40])
    (tmp_path / "rank_2").write_bytes(b"")
    (tmp_path / "rank_3").write_bytes(pickle.dumps({"version": "1.0", "entries": []}))
    (tmp_path / "rank_4").write_bytes(pickle.dumps(Path("/")))  # objects are refused
    (tmp_path / "notes.txt").write_text("not a dump")
    d = fr.load_dir(tmp_path)
    reasons = {s["file"]: s["reason"] for s in d.skipped}
    assert set(reasons) == {"rank_1", "rank_2", "rank_3", "rank_4"}
    assert "empty" in reasons["rank_2"] and "version" in reasons["rank_3"]
    assert d.missing == [1, 2, 3, 4]
    assert fr.main([str(tmp_path), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["flight_recorder"]["dumps"] == [0]
    assert fr.main([str(tmp_path / "nope")]) == 4


def test_empty_folder(tmp_path: Path) -> None:
    doc = fr.analyze(fr.load_dir(tmp_path))
    assert doc["root_causes"] == [] and doc["flight_recorder"]["world_size"] == 0


def test_analyze_command_reads_flight_recorder_dumps(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import json  # noqa: PLC0415

    from mycroft.cli import main as mycroft  # noqa: PLC0415

    for r in range(3):
        write(tmp_path, r, dump([*healthy(20, r), entry(21, 1050, retired=False)]))
    set_mtime(tmp_path, 1060)
    argv = ["analyze", "--flight-recorder", str(tmp_path), "--world-size", "4"]
    assert mycroft([*argv, "--json"]) == 3  # a culprit named
    best = json.loads(capsys.readouterr().out)["root_causes"][0]
    assert (best["rank"], best["component"], best["kind"]) == (3, "process", "hang")
    assert mycroft(["analyze", "--flight-recorder", str(tmp_path / "missing")]) == 4


def test_order_deadlock_blames_the_minority_issue_order(tmp_path: Path) -> None:
    """Ranks 0-2 wait in world seq 21 that rank 3 never issued; rank 3 waits
    in dp seq 21 that ranks 0-2 never issued: a control-edge cycle over two
    comms: a collective-order bug (``config``) naming the rank whose issue
    order differs from the majority, with both orders as evidence."""
    for r in range(4):
        rows = []
        for i in range(1, 21):
            rows.append(entry(i, i * 50 + r * 0.1, pg="0"))
            rows.append(entry(i, i * 50 + 25 + r * 0.1, pg="1"))
        pg = "1" if r == 3 else "0"
        rows.append(entry(21, 21 * 50 + r * 0.1, pg=pg, retired=False))
        write(tmp_path, r, dump(rows))
    set_mtime(tmp_path, 21 * 50 + 4000)
    doc = fr.analyze(fr.load_dir(tmp_path))
    best = doc["root_causes"][0]
    assert (best["rank"], best["kind"], best["component"]) == (3, "hang", "config")
    assert len({r["rank"] for r in doc["root_causes"] if r["best"]}) == 1
    majority = "ranks [0, 1, 2] issued all_reduce #21 of group 0 before all_reduce"
    assert f"{majority} #21 of group 1" in best["reason"]
    assert (
        "rank 3 issued all_reduce #21 of group 1 before all_reduce #21 of group 0"
        in best["reason"]
    )


def test_dumps_copied_days_later_cost_what_fresh_ones_do(tmp_path: Path) -> None:
    """8 ranks x 26 entries, files touched 3 days after the entries (scp, tar,
    object storage): the verdict of the fresh dump, in a bounded number of
    evaluations (it ran for hours when the mtime was the dump time)."""
    from mycroft.streams.analyze import Replay  # noqa: PLC0415

    for r in range(8):
        rows = healthy(25, r)
        if r != 5:
            rows.append(entry(26, 26 * 50, retired=False))
        write(tmp_path, r, dump(rows))
    set_mtime(tmp_path, 26 * 50 + 4000)
    fresh = fr.analyze(fr.load_dir(tmp_path))
    set_mtime(tmp_path, 3 * 86_400_000)
    d = fr.load_dir(tmp_path)
    copied = fr.analyze(d)
    rp = Replay()
    for ts, rec in fr.to_records(d):
        rp.feed(ts, rec)
    rp.finish()
    horizon_ticks = fr.DUMP_HORIZON_NS // 100_000_000
    assert len(rp.eval_wall_s) <= 26 * 50 // 100 + horizon_ticks + 2
    best = lambda doc: [(r["rank"], r["kind"]) for r in doc["root_causes"][:1]]  # noqa: E731
    assert best(copied) == best(fresh) == [(5, "hang")]
