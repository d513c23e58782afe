"""Trace files: round trip, gzip, truncated tails."""

from __future__ import annotations

from pathlib import Path

import pytest

from mycroft.errors import ConfigError
from mycroft.producers.tracefile import TraceFileWriter, read_frames, read_records
from tests.unit.samples import T0, all_records


@pytest.mark.parametrize("suffix", [".trace", ".trace.gz"])
def test_records_round_trip_in_order(tmp_path: Path, suffix: str) -> None:
    path = tmp_path / f"t{suffix}"
    records = all_records()
    with TraceFileWriter(path) as w:
        for i, r in enumerate(records):
            w.write(r, T0 + i)
    back = list(read_records(path))
    assert [ts for ts, _ in back] == [T0 + i for i in range(len(records))]
    assert [type(r).__name__ for _, r in back] == [type(r).__name__ for r in records]
    keys = [f.key for f in read_frames(path)]
    assert keys[3] == "job-1/host-0"  # topology is keyed by job/host
    assert keys[0] == "job-1"


def test_truncated_last_frame_is_dropped_not_raised(tmp_path: Path) -> None:
    path = tmp_path / "t.trace"
    with TraceFileWriter(path) as w:
        for r in all_records():
            w.write(r, T0)
    data = path.read_bytes()
    path.write_bytes(data[:-7])
    assert len(list(read_frames(path))) == len(all_records()) - 1


def test_not_a_trace_file_is_a_config_error(tmp_path: Path) -> None:
    path = tmp_path / "x"
    path.write_bytes(b"garbage")
    with pytest.raises(ConfigError, match="not a Mycroft trace"):
        list(read_frames(path))
