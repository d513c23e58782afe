"""Every expected failure of ``mycroft`` says what is wrong in a line or two,
what to do, and exits with its documented code; a traceback only with --debug."""

from __future__ import annotations

import errno
import gzip
import os
import socket
import subprocess
import sys
import types
from collections.abc import Callable
from pathlib import Path

import pytest

from mycroft import cli
from mycroft.cli_errors import ExitCode

USAGE, INPUT, UNAVAILABLE, EXTRA = 2, 4, 5, 6


@pytest.fixture(scope="module")
def closed_port() -> str:
    """``127.0.0.1:PORT`` where nothing listens."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"127.0.0.1:{port}"


@pytest.fixture(scope="module")
def trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("trace")
    code = cli.main(
        ["simulate", "--ranks", "8", "--tp", "8", "--duration", "1", "--seed", "1",
         "--out", str(out / "ok.trace.gz"), "--truth", str(out / "truth.json")]
    )  # fmt: skip
    assert code == 0
    return out / "ok.trace.gz"


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, list[str]]:
    code = cli.main(list(argv))
    err = capsys.readouterr().err
    return code, err.splitlines()


def _check(code: int, lines: list[str], want_code: int, *words: str) -> None:
    text = "\n".join(lines)
    assert code == want_code, text
    assert 1 <= len(lines) <= 2, text
    assert "Traceback" not in text
    for word in words:
        assert word in text, (word, text)


def test_exit_codes_are_the_documented_ones() -> None:
    assert [int(c) for c in ExitCode] == [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 130]
    readme = (Path(__file__).parents[2] / "README.md").read_text()
    for c in ExitCode:
        assert f"| {int(c)} |" in readme, c


def test_a_missing_path(capsys: pytest.CaptureFixture[str]) -> None:
    _check(*_run(capsys, "analyze", "/no/such.trace"), INPUT,
           "mycroft analyze: /no/such.trace: No such file or directory",
           "check the path")  # fmt: skip


def test_a_directory(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    _check(*_run(capsys, "analyze", str(tmp_path)), INPUT, "Is a directory")


def test_a_flight_recorder_folder_that_does_not_exist(
    capsys: pytest.CaptureFixture[str],
) -> None:
    _check(*_run(capsys, "analyze", "--flight-recorder", "/no/such"), INPUT,
           "/no/such is not a folder of dumps")  # fmt: skip


@pytest.mark.parametrize(
    "content",
    [b"", os.urandom(300), b"MYC"],
    ids=["empty", "random-bytes", "short"],
)
def test_a_file_that_is_not_a_trace(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, content: bytes
) -> None:
    path = tmp_path / "x.trace"
    path.write_bytes(content)
    _check(*_run(capsys, "analyze", str(path)), INPUT,
           f"{path} is not a Mycroft trace file")  # fmt: skip


def test_a_gzip_cut_before_its_first_record(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, trace: Path
) -> None:
    path = tmp_path / "cut.trace.gz"
    path.write_bytes(trace.read_bytes()[:20])
    _check(*_run(capsys, "analyze", str(path)), INPUT,
           f"{path} is cut short before its first record")  # fmt: skip


def test_a_trace_cut_short_is_read_up_to_the_cut(
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
    tmp_path: Path,
    trace: Path,
) -> None:
    """What a recorder that died with its job leaves: analyzed up to its
    last whole frame, the cut named (README, "Exit codes")."""
    packed = trace.read_bytes()
    whole = gzip.decompress(packed)
    halves = [("cut.trace", whole[: len(whole) // 2]),
              ("cut.trace.gz", packed[: len(packed) // 2])]  # fmt: skip
    for name, data in halves:
        path = tmp_path / name
        path.write_bytes(data)
        code = cli.main(["analyze", str(path)])
        assert code in (0, 3), capsys.readouterr().err
        assert "cut short" in caplog.text or "truncated" in caplog.text
        caplog.clear()


def test_random_bytes_named_gz(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = tmp_path / "x.trace.gz"
    path.write_bytes(b"\x35\x9e" + os.urandom(100))
    _check(*_run(capsys, "analyze", str(path)), INPUT,
           f"cannot read {path}: Not a gzipped file")  # fmt: skip


def test_a_good_gzip_trace_still_works(
    capsys: pytest.CaptureFixture[str], trace: Path
) -> None:
    assert gzip.open(trace).read(4)
    assert cli.main(["analyze", str(trace)]) == 0


def test_an_output_folder_that_does_not_exist(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    truth = str(tmp_path / "t.json")
    argv = ["simulate", "--ranks", "8", "--tp", "8", "--duration", "1",
            "--out", "/no/such/dir/x.trace", "--truth", truth]  # fmt: skip
    _check(*_run(capsys, *argv), INPUT, "/no/such/dir/x.trace: No such file")


@pytest.mark.parametrize(
    ("argv", "setting"),
    [
        (["topics", "create", "--bootstrap", "{addr}"], "--bootstrap"),
        (
            [
                "simulate",
                "--ranks",
                "8",
                "--tp",
                "8",
                "--duration",
                "1",
                "--truth",
                "{tmp}/t.json",
                "--bootstrap",
                "{addr}",
            ],
            "--bootstrap",
        ),
        (["replay", "{tmp}/x.trace", "--bootstrap", "{addr}"], "--bootstrap"),
        (["streams", "worker", "--bootstrap", "{addr}"], "--bootstrap"),
        (
            ["sinks", "--bootstrap", "{addr}", "--prometheus-listen", ":0"],
            "--bootstrap",
        ),
        (["incidents", "list", "--bootstrap", "{addr}"], "--bootstrap"),
        (["demo", "--bootstrap", "{addr}"], "--bootstrap"),
    ],  # fmt: skip
    ids=["topics", "simulate", "replay", "streams", "sinks", "incidents", "demo"],
)
def test_an_unreachable_broker_is_named_with_its_setting(
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    closed_port: str,
    argv: list[str],
    setting: str,
) -> None:
    args = [a.format(addr=closed_port, tmp=tmp_path) for a in argv]
    _check(*_run(capsys, *args), UNAVAILABLE,
           f"cannot reach Kafka at {closed_port}", f"point {setting} at")  # fmt: skip


def test_the_broker_from_the_environment_names_the_variable(
    capsys: pytest.CaptureFixture[str],
    closed_port: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("MYCROFT_BOOTSTRAP", closed_port)
    _check(*_run(capsys, "incidents", "list"), UNAVAILABLE,
           f"Kafka at {closed_port}", "MYCROFT_BOOTSTRAP")  # fmt: skip


@pytest.mark.parametrize(
    ("argv", "variable", "section"),
    [
        (["incidents", "list"], "MYCROFT_INCIDENTS__BOOTSTRAP", "incidents"),
        (["topics", "create"], "MYCROFT_TOPICS__BOOTSTRAP", "topics"),
        (["streams", "worker"], "MYCROFT_STREAMS__BOOTSTRAP", "streams"),
        (["replay", "{tmp}/x.trace"], "MYCROFT_REPLAY__BOOTSTRAP", "replay"),
    ],
    ids=["incidents", "topics", "streams", "replay"],
)
def test_the_broker_from_any_settings_layer_is_checked_and_named(
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    closed_port: str,
    monkeypatch: pytest.MonkeyPatch,
    argv: list[str],
    variable: str,
    section: str,
) -> None:
    """The preflight finds the address where the command's settings would:
    its own variable, then the [section] of the config file."""
    args = [a.format(tmp=tmp_path) for a in argv]
    monkeypatch.setenv(variable, closed_port)
    _check(*_run(capsys, *args), UNAVAILABLE, f"Kafka at {closed_port}", variable)
    monkeypatch.delenv(variable)
    config = tmp_path / "mycroft.toml"
    field = variable.rsplit("__", 1)[1].lower()
    config.write_text(f'[{section}]\n{field} = "{closed_port}"\n', "utf-8")
    _check(*_run(capsys, *args, "--config", str(config)), UNAVAILABLE,
           f"Kafka at {closed_port}", f"[{section}] of {config}")  # fmt: skip


def test_an_unreachable_opensearch(
    capsys: pytest.CaptureFixture[str], closed_port: str
) -> None:
    url = f"http://{closed_port}"
    argv = ["sinks", "--bootstrap", closed_port, "--opensearch-url", url]
    _check(*_run(capsys, *argv), UNAVAILABLE,
           f"cannot reach OpenSearch at {url}", "--opensearch-url")  # fmt: skip


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (
            ["analyze", "--bogus"],
            ["unrecognized arguments: --bogus", "see 'mycroft analyze --help'"],
        ),
        (["analyze"], ["give trace files, or --flight-recorder DIR"]),
        (
            [
                "simulate",
                "--ranks",
                "8",
                "--tp",
                "3",
                "--out",
                "{tmp}/x.trace",
                "--truth",
                "{tmp}/t.json",
            ],
            ["--ranks 8 must equal"],
        ),
        (["sinks", "--prometheus-listen", ":0"], ["give --bootstrap HOST:PORT"]),
        (["sinks", "--opensearch-url", "ftp://x"], ["must be an http://"]),
        (["incidents", "show"], ["required: ID"]),
        (["incidents", "list"], ["give --bootstrap HOST:PORT or MYCROFT_BOOTSTRAP"]),
        (["no-such-command"], ["unknown command 'no-such-command'"]),
        (["broker", "start", "--bogus"], ["mycroft broker: unrecognized arguments",
                                          "see 'mycroft broker --help'"]),
    ],  # fmt: skip
    ids=[
        "unknown-flag",
        "no-input",
        "ratio",
        "sink-no-broker",
        "bad-url",
        "no-id",
        "no-broker",
        "command",
        "prog",
    ],  # fmt: skip
)
def test_bad_flags_and_combinations_are_usage_errors(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    argv: list[str],
    words: list[str],
) -> None:
    monkeypatch.delenv("MYCROFT_BOOTSTRAP", raising=False)
    code, lines = _run(capsys, *(a.format(tmp=tmp_path) for a in argv))
    if argv[0] == "no-such-command":  # the command list follows
        lines = lines[:1]
    _check(code, lines, USAGE, *words)


def test_a_missing_extra_names_it() -> None:
    script = (
        "import sys; sys.modules['networkx'] = None\n"
        "from mycroft.cli import main; sys.exit(main(['analyze', 'x.trace']))"
    )
    proc = subprocess.run(
        [sys.executable, "-c", script],
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
    )
    _check(proc.returncode, proc.stderr.splitlines(), EXTRA,
           "needs networkx", "'streams' extra",
           "pip install 'mycroft-trace[streams]'")  # fmt: skip


def _command(monkeypatch: pytest.MonkeyPatch, main: Callable[[list[str]], int]) -> None:
    module = types.ModuleType("mycroft_test_command")
    module.main = main  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "mycroft_test_command", module)
    monkeypatch.setitem(cli.COMMANDS, "boom", ("mycroft_test_command", "test"))


def _raise(exc: BaseException) -> Callable[[list[str]], int]:
    def main(argv: list[str]) -> int:
        raise exc

    return main


def test_an_unexpected_error_is_one_line_and_a_traceback_only_with_debug(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    _command(monkeypatch, _raise(RuntimeError("kaputt")))
    want = "mycroft boom: unexpected error: RuntimeError: kaputt"
    _check(*_run(capsys, "boom"), 1, want, "--debug")
    code = cli.main(["boom", "--debug"])
    err = capsys.readouterr().err
    assert code == 1
    assert "Traceback" in err and "RuntimeError: kaputt" in err
    monkeypatch.setenv("MYCROFT_DEBUG", "1")
    assert cli.main(["boom"]) == 1
    assert "Traceback" in capsys.readouterr().err


def test_ctrl_c_exits_130(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    _command(monkeypatch, _raise(KeyboardInterrupt()))
    _check(*_run(capsys, "boom"), 130, "mycroft boom: interrupted")


def test_an_address_in_use(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    err = OSError(errno.EADDRINUSE, "Address already in use")
    _command(monkeypatch, _raise(err))
    _check(*_run(capsys, "boom", "--prometheus-listen", "127.0.0.1:9465"),
           UNAVAILABLE, "cannot listen on 127.0.0.1:9465",
           "another --prometheus-listen")  # fmt: skip


def test_a_usage_error_comes_before_an_unreachable_broker(
    capsys: pytest.CaptureFixture[str], closed_port: str
) -> None:
    _check(*_run(capsys, "incidents", "show", "--bootstrap", closed_port), USAGE,
           "required: ID")  # fmt: skip
    _check(*_run(capsys, "topics", "create", "--bootstrap", closed_port, "--bogus"),
           USAGE, "unrecognized arguments: --bogus")  # fmt: skip
