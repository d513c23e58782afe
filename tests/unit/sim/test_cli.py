"""``mycroft simulate`` flags, validation and the truth file; fault spec parsing."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from mycroft.errors import ConfigError, MycroftError
from mycroft.producers.sim import cli
from mycroft.producers.sim.cli import main
from mycroft.producers.sim.config import SimConfig
from mycroft.producers.sim.faults import parse_spec, resolve
from mycroft.producers.tracefile import ListWriter, RecordWriter, read_records
from mycroft.schemas.records import StateBatch
from tests.unit.samples import T0, state_batch


def test_cli_writes_trace_and_truth(tmp_path: Path) -> None:
    out, truth = tmp_path / "t.trace", tmp_path / "t.json"
    code = main(
        [
            "--ranks",
            "32",
            "--tp",
            "8",
            "--pp",
            "2",
            "--dp",
            "2",
            "--duration",
            "1.5",
            "--seed",
            "5",
            "--job-id",
            "j1",
            "--fault",
            "gpu-hang:rank=3,at=0.5",
            "--out",
            str(out),
            "--truth",
            str(truth),
        ]
    )
    assert code == 0
    doc = json.loads(truth.read_text())
    assert doc["trace_start_s"] == 1767225600.0
    assert doc["faults"][0]["fault"] == "gpu-hang"
    assert doc["faults"][0]["rank"] == 3
    assert doc["faults"][0]["onset_s"] == pytest.approx(1767225600.5)
    states = [r for _, r in read_records(out) if isinstance(r, StateBatch)]
    assert len(states) == 15 * 4
    assert {s.header.job_id for s in states} == {"j1"}


def test_cli_rejects_bad_shapes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["--out", str(tmp_path / "x"), "--truth", str(tmp_path / "y")]
    assert main(["--ranks", "60", "--tp", "8", "--pp", "2", "--dp", "4", *args]) == 2
    assert "--tp x --pp x --dp" in capsys.readouterr().err
    assert main(["--ranks", "48", "--tp", "3", "--pp", "1", "--dp", "16", *args]) == 2
    assert "must divide" in capsys.readouterr().err
    assert main(["--ranks", "8", "--tp", "8", "--fault", "nic-down", *args]) == 2
    assert "at least 2 hosts" in capsys.readouterr().err
    assert (
        main(["--ranks", "16", "--tp", "8", "--dp", "2", "--fault", "bogus", *args])
        == 2
    )
    assert "unknown fault" in capsys.readouterr().err
    assert main(["--ranks", "16", "--tp", "8", "--speed", "0", *args]) == 2
    assert "--speed must be" in capsys.readouterr().err


def test_paced_writer_holds_records_for_trace_time_over_speed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = [100.0]
    monkeypatch.setattr(cli.time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(cli.time, "sleep", lambda s: clock.__setitem__(0, clock[0] + s))
    inner = ListWriter()
    paced = cli.PacedWriter(inner, start_ns=T0, speed=0.25)
    paced.write(state_batch(0), T0 + 2_000_000_000)  # 2 trace s = 8 wall s
    assert clock[0] == pytest.approx(108.0)
    paced.write(state_batch(1), T0 + 1_000_000_000)  # already due: no wait
    assert clock[0] == pytest.approx(108.0) and len(inner.records) == 2


def test_parse_spec_validates_keys() -> None:
    spec = parse_spec("link-flap:rank=3,period=0.5,down=0.1")
    assert spec.params == {"rank": "3", "period": "0.5", "down": "0.1"}
    with pytest.raises(ConfigError, match="key one of"):
        parse_spec("nic-down:colour=red")
    with pytest.raises(ConfigError, match="key=value"):
        parse_spec("nic-down:rank")


def test_omitted_keys_are_drawn_deterministically() -> None:
    cfg = SimConfig(tp=8, pp=2, dp=2, duration_s=10.0)
    a = resolve(parse_spec("nic-bandwidth"), cfg, np.random.default_rng(1))
    b = resolve(parse_spec("nic-bandwidth"), cfg, np.random.default_rng(1))
    assert a == b
    assert 3.0 <= a.at_s <= 5.0
    assert 0.0 < a.severity < 1.0
    assert a.rank is not None and len(a.ranks) == 2


def test_resolve_rejects_out_of_range() -> None:
    cfg = SimConfig(tp=8, pp=2, dp=2, duration_s=10.0)
    rng = np.random.default_rng(0)
    with pytest.raises(ConfigError, match="rank"):
        resolve(parse_spec("gpu-hang:rank=32"), cfg, rng)
    with pytest.raises(ConfigError, match="not before"):
        resolve(parse_spec("gpu-hang:at=12"), cfg, rng)
    with pytest.raises(ConfigError, match="severity"):
        resolve(parse_spec("gpu-power-cap:severity=1.5"), cfg, rng)


def _argv(out: Path | str, truth: Path | str, *extra: str) -> list[str]:
    return ["simulate", "--ranks", "16", "--tp", "8", "--dp", "2", "--duration", "3",
            "--out", str(out), "--truth", str(truth), *extra]  # fmt: skip


@pytest.mark.parametrize(
    ("extra", "out", "truth", "code"),
    [
        (["--fault", "bogus"], "t.trace", "t.json", 2),
        (["--fault", "nic-down:rank=99"], "t.trace", "t.json", 2),  # in the run
        (["--fault", "gpu-hang:at=30"], "t.trace.gz", "t.json", 2),
        (["--speed", "0"], "t.trace", "t.json", 2),
        ([], "t.trace", "missing/t.json", 4),
        ([], "missing/t.trace", "t.json", 4),
        ([], ".", "t.json", 4),  # the output is a folder
    ],
    ids=[
        "fault-name",
        "fault-rank",
        "fault-time",
        "speed",
        "truth-dir",
        "out-dir",
        "out-folder",
    ],  # fmt: skip
)
def test_a_rejected_run_leaves_no_file(
    tmp_path: Path, extra: list[str], out: str, truth: str, code: int
) -> None:
    from mycroft.cli import main as mycroft  # noqa: PLC0415

    assert mycroft(_argv(tmp_path / out, tmp_path / truth, *extra)) == code
    assert list(tmp_path.iterdir()) == []


def test_a_rejected_run_keeps_an_existing_file(tmp_path: Path) -> None:
    out, truth = tmp_path / "t.trace", tmp_path / "t.json"
    out.write_bytes(b"an earlier trace")
    assert main(_argv(out, truth, "--fault", "nic-down:rank=99")[1:]) == 2
    assert out.read_bytes() == b"an earlier trace"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.trace"]


@pytest.mark.parametrize("error", [MycroftError("the run failed"), KeyboardInterrupt()])
def test_a_run_failing_midway_leaves_no_partial_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, error: BaseException
) -> None:
    def fails_midway(cfg: SimConfig, specs: object, writer: RecordWriter) -> None:
        for i in range(50):
            writer.write(state_batch(i), T0 + i)
        raise error

    monkeypatch.setattr(cli, "simulate", fails_midway)
    argv = _argv(tmp_path / "t.trace", tmp_path / "t.json")[1:]
    if isinstance(error, KeyboardInterrupt):
        with pytest.raises(KeyboardInterrupt):
            main(argv)
    else:
        assert main(argv) == 1
    assert list(tmp_path.iterdir()) == []


def test_a_run_that_succeeds_leaves_its_two_files_only(tmp_path: Path) -> None:
    out, truth = tmp_path / "t.trace.gz", tmp_path / "t.json"
    assert main(_argv(out, truth)[1:]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.json", "t.trace.gz"]
    assert json.loads(truth.read_text())["duration_s"] == 3.0
    assert len(list(read_records(out))) > 0


def test_counters_pick_the_counter_model() -> None:
    base = ["--ranks", "16", "--tp", "4", "--pp", "2", "--dp", "2"]
    base += ["--out", "x", "--truth", "t"]
    for mode in ("fluid", "slots", "nccl"):
        args = cli.build_parser().parse_args([*base, "--counters", mode])
        assert cli.config_from(args).hardware.counters == mode
    default = cli.config_from(cli.build_parser().parse_args(base))
    assert default.hardware.counters == "fluid"
