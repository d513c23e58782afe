"""``mycroft analyze --json``: a fault that clears closes its incident."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mycroft import cli
from mycroft.producers.tracefile import read_records
from mycroft.streams.core.two_stage import TwoStageReplay

S = 1_000_000_000


@pytest.fixture(scope="module")
def cleared(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 32-rank job whose NIC runs slow from 4 s to 8 s, 16 s in all."""
    folder = tmp_path_factory.mktemp("closure")
    out = folder / "cleared.trace"
    code = cli.main(
        ["simulate", "--ranks", "32", "--tp", "8", "--pp", "2", "--dp", "2",
         "--duration", "16", "--seed", "1",
         "--fault", "nic-bandwidth:at=4,duration=4",
         "--out", str(out), "--truth", str(folder / "cleared.json")]
    )  # fmt: skip
    assert code == 0
    return out


def _rows(capsys: pytest.CaptureFixture[str], path: Path) -> list[dict[str, object]]:
    assert cli.main(["analyze", "--json", str(path)]) == 3
    rows: list[dict[str, object]] = json.loads(capsys.readouterr().out)["root_causes"]
    return rows


def test_rows_carry_the_closure_and_a_replay_gives_the_same(
    cleared: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rows = _rows(capsys, cleared)
    assert rows and {r["state"] for r in rows} == {"closed"}
    best = next(r for r in rows if r["best"])
    closed_at = best["closed_at_s"]
    assert isinstance(closed_at, float) and isinstance(best["resolved_at_s"], float)
    # closed on event time: after the fault ended and nothing fired for 5 s,
    # before the trace's end (the ground truth is read by the test only)
    (fault,) = json.loads(cleared.with_suffix(".json").read_text())["faults"]
    ended_s = fault["onset_s"] + fault["duration_s"]
    assert ended_s + 5 < closed_at < ended_s - fault["at_s"] + 16
    assert str(best["close_reason"]).endswith("s of event time (incident_quiet_s 5)")
    assert _rows(capsys, cleared) == rows  # same records, same closure


def test_text_output_says_when_and_why(
    cleared: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["analyze", str(cleared)]) == 3
    text = capsys.readouterr().out
    (line,) = [ln for ln in text.splitlines() if ln.startswith("  closed ")]
    assert "s of event time (incident_quiet_s 5)" in line


def test_the_two_stage_worker_closes_at_the_same_event_time(
    cleared: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    best = next(r for r in _rows(capsys, cleared) if r["best"])
    rp = TwoStageReplay("sim", 4)
    for ts, rec in read_records(cleared):
        rp.feed(ts, rec)
    rp.close()
    (rc,) = rp.causes.values()
    closed_at = best["closed_at_s"]
    assert isinstance(closed_at, float) and rc.closed_ns is not None
    assert rc.is_closed and abs(rc.closed_ns - closed_at * S) < 1_000  # float s
    assert [r.revision for r in rp.revisions] == list(range(rc.revision + 1))
