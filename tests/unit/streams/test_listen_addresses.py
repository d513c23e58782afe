"""Every listener of the stream worker takes an address, loopback by default."""

from __future__ import annotations

import socket
import urllib.request

from mycroft.streams.app import faust_config
from mycroft.streams.faust_settings import StreamSettings, parse_settings, to_argv
from mycroft.streams.invalid_records import WorkerMetrics


def test_metrics_and_web_listen_on_loopback_unless_told() -> None:
    s = StreamSettings("h:1")
    assert (s.metrics_address, s.web_address) == ("127.0.0.1", "127.0.0.1")
    assert faust_config(s)["web_bind"] == "127.0.0.1"
    _, told = parse_settings(
        ["worker", "--bootstrap", "h:1", "--metrics-address", "0.0.0.0",
         "--web-address", "0.0.0.0"], {},
    )  # fmt: skip
    assert (told.metrics_address, told.web_address) == ("0.0.0.0", "0.0.0.0")
    assert "--metrics-address" in to_argv(told)  # a child worker gets it too
    _, env = parse_settings(
        ["worker", "--bootstrap", "h:1"],
        {"MYCROFT_STREAMS__METRICS_ADDRESS": "0.0.0.0"},
    )
    assert env.metrics_address == "0.0.0.0"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_the_metrics_server_binds_the_address_it_is_given() -> None:
    port = _free_port()
    WorkerMetrics().serve(port, "127.0.0.1")
    url = f"http://127.0.0.1:{port}/metrics"
    assert b"mycroft_" in urllib.request.urlopen(url, timeout=5).read()  # noqa: S310
    with socket.socket() as probe:  # not on another interface of this host
        probe.settimeout(1)
        host = socket.gethostbyname(socket.gethostname())
        if host.startswith("127."):
            return  # no other interface to try
        assert probe.connect_ex((host, port)) != 0
