"""What people read: times, comm ids, anomaly lines, and analyze's exit code.

Times are ISO-8601 UTC to the millisecond with the seconds since the job's
first record; a comm id is ``0x`` and 16 hex digits in text, in ids and in
JSON's ``*_hex`` fields (README, "Glossary").
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from mycroft import cli
from mycroft.incident_card import anomaly_json, evidence_json, revision_json
from mycroft.incident_text import anomaly_line, detector_text, live_lines
from mycroft.schemas.records import Anomaly, Culprit, Evidence, RootCause
from mycroft.schemas.text import comm_hex, iso, when
from mycroft.schemas.vocab import Component, FaultKind

S = 1_000_000_000
T0 = 1_767_225_600 * S  # 2026-01-01T00:00:00Z
COMM = 0x0BDEF175E79F5775
ISO = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z"


def _anomaly(detector: str = "hang") -> Anomaly:
    return Anomaly(
        "a1", "job", FaultKind.HANG, (COMM, 7), (3,), T0, T0 + 7_800_000_000,
        detector, f"comm {comm_hex(COMM)} made no progress",
    )  # fmt: skip


def test_a_comm_id_is_0x_and_16_hex_digits() -> None:
    assert comm_hex(COMM) == "0x0bdef175e79f5775"  # the leading zero stays
    assert comm_hex(7) == "0x0000000000000007"
    assert comm_hex(2**64 - 1) == "0xffffffffffffffff"
    assert comm_hex(-1) == "0xffffffffffffffff"  # Avro's signed long of it


def test_times_are_iso_to_the_millisecond_with_seconds_since_start() -> None:
    assert iso(T0) == "2026-01-01T00:00:00.000Z"
    assert iso(T0 + 7_799_999_999) == "2026-01-01T00:00:07.799Z"  # cut, not rounded
    assert when(T0 + 7_800_000_000, T0) == "2026-01-01T00:00:07.800Z (+7.800 s)"
    assert when(T0 + 7_800_000_000) == "2026-01-01T00:00:07.800Z"
    assert when(T0, T0 + S) == "2026-01-01T00:00:00.000Z (-1.000 s)"


def test_an_anomaly_line_names_kind_and_detector_once() -> None:
    assert anomaly_line(_anomaly(), T0) == (
        "2026-01-01T00:00:07.800Z (+7.800 s)  hang: comm 0x0bdef175e79f5775 "
        "made no progress"
    )
    assert detector_text(_anomaly("silence")) == "hang (silence)"
    assert anomaly_line(_anomaly("silence")).startswith(
        "2026-01-01T00:00:07.800Z  hang (silence): comm 0x0bdef175e79f5775"
    )


def test_json_keeps_comm_numbers_and_adds_their_text() -> None:
    doc = anomaly_json(_anomaly())
    assert doc["comms"] == [COMM, 7]
    assert doc["comms_hex"] == ["0x0bdef175e79f5775", "0x0000000000000007"]
    assert (doc["onset_at"], doc["detected_at"]) == (
        "2026-01-01T00:00:00.000Z",
        "2026-01-01T00:00:07.800Z",
    )
    assert evidence_json(Evidence("x", 3, COMM, 12)) == {
        "fact": "x", "rank": 3, "comm": COMM, "comm_hex": "0x0bdef175e79f5775",
        "op_seq": 12,
    }  # fmt: skip
    assert evidence_json(Evidence("y"))["comm_hex"] is None


def _root_cause() -> RootCause:
    culprit = Culprit(3, "node-1", Component.GPU, FaultKind.HANG, 0.7)
    return RootCause(
        "job:hang:0x0bdef175e79f5775:1", 0, "job", FaultKind.HANG, (culprit,),
        (Evidence("rank 3 froze", 3, COMM),), ("a1",), T0, T0 + S, T0 + 2 * S,
    )  # fmt: skip


def test_revision_json_writes_evidence_comms_both_ways() -> None:
    (step,) = revision_json(_root_cause())["evidence"]
    assert (step["comm"], step["comm_hex"]) == (COMM, "0x0bdef175e79f5775")


def test_live_lines_under_a_root_cause_line_up_after_the_stamp() -> None:
    stamp = when(T0 + 2 * S, T0)
    head, step, where, evidence = live_lines(_root_cause(), stamp)
    assert head == (
        f"  {stamp}  ROOT CAUSE rev 0: hang at rank 3 on host node-1: the GPU, "
        "likely (0.70)"
    )
    indent = len(f"  {stamp}  ")
    assert step == " " * indent + (
        "next step: drain node-1 and run the GPU diagnostics on rank 3's GPU "
        "(dcgmi diag -r 3; nvidia-smi -q for Xid and ECC errors)"
    )
    assert where == " " * indent + "incident job:hang:0x0bdef175e79f5775:1 of job job"
    assert evidence == " " * indent + "evidence: rank 3 froze"
    (line,) = live_lines(_anomaly(), stamp)
    assert line == f"  {stamp}  anomaly hang: comm 0x0bdef175e79f5775 made no progress"


def _simulate(folder: Path, name: str, *fault: str) -> Path:
    out = folder / f"{name}.trace"
    code = cli.main(
        ["simulate", "--ranks", "32", "--tp", "8", "--pp", "2", "--dp", "2",
         "--duration", "12", "--seed", "1", *fault,
         "--out", str(out), "--truth", str(folder / f"{name}.json")]
    )  # fmt: skip
    assert code == 0
    return out


@pytest.fixture(scope="module")
def traces(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A healthy 32-rank job and one whose NIC goes down at 6 s, 12 s each."""
    folder = tmp_path_factory.mktemp("traces")
    return {
        "healthy": _simulate(folder, "healthy"),
        "faulty": _simulate(folder, "faulty", "--fault", "nic-down:at=6"),
    }


def _analyze(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    code = cli.main(["analyze", *argv])
    return code, capsys.readouterr().out


def test_analyze_exits_0_on_a_healthy_trace(
    traces: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    assert _analyze(capsys, str(traces["healthy"])) == (0, "no anomalies\n")
    code, out = _analyze(capsys, str(traces["healthy"]), "--json")
    assert code == 0
    assert json.loads(out)["root_causes"] == []


def test_analyze_exits_3_when_it_names_a_root_cause(
    traces: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    code, out = _analyze(capsys, str(traces["faulty"]))
    assert code == 3
    assert "incident sim:hang:0x" in out
    code, out = _analyze(capsys, str(traces["faulty"]), "--json")
    assert code == 3
    assert json.loads(out)["root_causes"][0]["best"] is True


def test_analyze_text_and_json_agree_on_comm_ids_and_times(
    traces: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    path = str(traces["faulty"])
    text = _analyze(capsys, path, "--verbose")[1]
    doc = json.loads(_analyze(capsys, path, "--json")[1])
    start = doc["jobs"]["sim"]
    assert start == {"start_s": T0 / S, "start_at": "2026-01-01T00:00:00.000Z"}
    # Every comm id in the text is 0x + 16 digits, and the JSON's are the same.
    assert not re.search(r"comm (?!0x[0-9a-f]{16}\b)", text)
    in_text = set(re.findall(r"\b0x[0-9a-f]{16}\b", text))
    in_json = {h for a in doc["anomalies"] for h in a["comms_hex"]}
    assert in_text == in_json and in_json
    for a in doc["anomalies"]:
        assert a["comms_hex"] == [comm_hex(c) for c in a["comms"]]
        if a["detector"] == "hang":  # a hang's id names its comm
            assert f":{a['comms_hex'][0]}:" in a["anomaly_id"]
    # Each anomaly line: its detection time and the seconds since the start.
    lines = [ln.strip() for ln in text.splitlines() if re.match(rf"  {ISO}", ln)]
    assert len(lines) == len(doc["anomalies"])
    for line, a in zip(lines, doc["anomalies"], strict=True):
        at, since = re.match(rf"({ISO}) \(\+(\d+\.\d{{3}}) s\)  ", line).groups()
        assert at == a["detected_at"]
        assert float(since) == pytest.approx(a["detected_at_s"] - start["start_s"])
    (incident,) = [ln for ln in text.splitlines() if ln.startswith("  incident ")]
    row = doc["root_causes"][0]
    assert f" since {row['onset_at']} (+" in incident
