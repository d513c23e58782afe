"""Run a real Prometheus server (Debian's package) scraping given targets at 1 s.

``.ci/run`` installs it with ``apt-get install -y --no-install-recommends
prometheus``; the package's own systemd service is not used. Each
:class:`PrometheusServer` writes its own config and TSDB folder and listens on
a free loopback port. The first scrape shows in queries only ~5 s after start
(target sync ticks), so wait with :meth:`PrometheusServer.wait_for_target`. CLI::

    mycroft prometheus start --target 127.0.0.1:9464 \
        [--rules infra/prometheus/mycroft-alerts.yml --alertmanager 127.0.0.1:9093]
    mycroft prometheus stop
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from mycroft.cli_parser import MycroftParser, mycroft_parser
from mycroft.config import state_dir
from mycroft.errors import MycroftError
from mycroft.infra import _kafka_props as kp
from mycroft.infra._service import DetachedCli, LocalService, run_cli

__all__ = ["PrometheusError", "PrometheusServer", "find_binary", "main"]

logger = logging.getLogger(__name__)

INSTALL_HINT = "apt-get install -y --no-install-recommends prometheus"
STATE_NAME = "prometheus.json"


class PrometheusError(MycroftError):
    """Prometheus is missing, failed to start, or a query failed."""


def find_binary() -> str:
    """``$MYCROFT_PROMETHEUS_BIN`` or ``prometheus`` on PATH.

    Raises:
        PrometheusError: not found; the message says how to install it.
    """
    found = os.environ.get("MYCROFT_PROMETHEUS_BIN") or shutil.which("prometheus")
    if not found:
        raise PrometheusError(f"the prometheus binary is not on PATH; {INSTALL_HINT}")
    return found


def render_config(
    targets: Sequence[str],
    job: str = "mycroft",
    *,
    rule_files: Sequence[Path] = (),
    alertmanagers: Sequence[str] = (),
) -> str:
    """prometheus.yml scraping ``targets`` (``host:port``) every second.

    Rules in ``rule_files`` are evaluated every second and their alerts sent
    to ``alertmanagers`` (``host:port``). JSON is valid YAML, so no YAML
    library is needed.
    """
    config: dict[str, Any] = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "scrape_configs": [
            {
                "job_name": job,
                "scrape_interval": "1s",
                "scrape_timeout": "1s",
                "static_configs": [{"targets": list(targets)}],
            }
        ],
    }
    if rule_files:
        config["rule_files"] = [str(Path(f).resolve()) for f in rule_files]
    if alertmanagers:
        static = [{"targets": list(alertmanagers)}]
        config["alerting"] = {"alertmanagers": [{"static_configs": static}]}
    return json.dumps(config, indent=2) + "\n"


class PrometheusServer(LocalService):
    """One Prometheus on ``127.0.0.1:<free port>`` scraping ``targets``.

    Args:
        targets: ``host:port`` of each ``/metrics`` endpoint (job ``mycroft``).
        workdir: config and TSDB folder; a new temporary one if None.
        keep: keep a temporary ``workdir`` after :meth:`close`.
        rule_files: alerting rules to load (``infra/prometheus/mycroft-alerts.yml``).
        alertmanagers: ``host:port`` of Alertmanagers that receive the alerts.
    """

    display_name = "Prometheus"
    log_name = "prometheus.log"
    error = PrometheusError

    def __init__(
        self,
        targets: Sequence[str],
        workdir: Path | None = None,
        *,
        keep: bool = False,
        rule_files: Sequence[Path] = (),
        alertmanagers: Sequence[str] = (),
    ) -> None:
        super().__init__(workdir, keep=keep, prefix="mycroft-prometheus-")
        self.targets = tuple(targets)
        self.rule_files = tuple(rule_files)
        self.alertmanagers = tuple(alertmanagers)
        self._port: int | None = None

    @property
    def url(self) -> str:
        """``http://127.0.0.1:PORT``."""
        if self._port is None:
            raise PrometheusError("Prometheus has no port yet; call start() first")
        return f"http://{kp.HOST}:{self._port}"

    def start(self, timeout_s: float = 30.0, *, detach: bool = False) -> str:
        """Start it and wait for ``/-/ready``; return the URL.

        Raises:
            PrometheusError: no binary, it exited, or was not ready in time.
        """
        if self.pid is not None:
            return self.url
        binary = find_binary()
        self.workdir.mkdir(parents=True, exist_ok=True)
        config = self.workdir / "prometheus.yml"
        text = render_config(
            self.targets, rule_files=self.rule_files, alertmanagers=self.alertmanagers
        )
        config.write_text(text, "utf-8")
        if self._port is None:
            self._port = kp.pick_free_ports().client
        cmd = [binary, f"--config.file={config}",
               f"--web.listen-address={kp.HOST}:{self._port}",
               f"--storage.tsdb.path={self.workdir / 'data'}",
               "--storage.tsdb.retention.time=1h", "--web.enable-lifecycle",
               "--log.level=warn"]  # fmt: skip
        started = time.monotonic()
        self._popen(cmd, detach)
        self._wait_until(self._ready, timeout_s)
        self.startup_s = time.monotonic() - started
        logger.info("Prometheus ready at %s in %.2f s", self.url, self.startup_s)
        return self.url

    def _ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as resp:  # noqa: S310 (our http URL)
                return int(resp.status) == 200
        except (OSError, ValueError):
            return False

    def api(self, path: str, **params: str) -> Any:
        """GET ``/api/v1/<path>``; return its ``data``.

        Raises:
            PrometheusError: HTTP or API error.
        """
        query = urllib.parse.urlencode(params)
        url = f"{self.url}/api/v1/{path}" + (f"?{query}" if query else "")
        try:
            with urllib.request.urlopen(url, timeout=10) as resp:  # noqa: S310 (our http URL)
                reply = json.load(resp)
        except urllib.error.HTTPError as exc:
            with exc:
                body = exc.read(500).decode("utf-8", "replace")
            raise PrometheusError(f"GET {url}: HTTP {exc.code}: {body}") from exc
        except (OSError, ValueError) as exc:
            raise PrometheusError(f"GET {url}: {exc}") from exc
        if reply.get("status") != "success":
            raise PrometheusError(f"GET {url}: {reply.get('error', reply)}")
        return reply["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        """Instant query; return the ``result`` list (``metric`` and ``value``)."""
        data = self.api("query", query=expr)
        result: list[dict[str, Any]] = data["result"]
        return result

    def query_range(
        self, expr: str, start_s: float, end_s: float, step_s: float = 1.0
    ) -> list[dict[str, Any]]:
        """Range query, as a dashboard's graph runs; each result has ``values``."""
        data = self.api("query_range", query=expr, start=f"{start_s:.3f}",
                        end=f"{end_s:.3f}", step=f"{step_s:g}")  # fmt: skip
        result: list[dict[str, Any]] = data["result"]
        return result

    def alerts(self) -> list[dict[str, Any]]:
        """Alerts pending or firing now (``labels``, ``state``, ``annotations``)."""
        found: list[dict[str, Any]] = self.api("alerts")["alerts"]
        return found

    def target_health(self) -> dict[str, str]:
        """Health (``up``, ``down``, ``unknown``) of each active target's scrape URL."""
        data = self.api("targets")
        return {t["scrapeUrl"]: t["health"] for t in data["activeTargets"]}

    def wait_for_target(self, target: str, timeout_s: float = 20.0) -> None:
        """Wait until ``up{instance=target} == 1`` is visible in queries."""
        expr = f'up{{instance="{target}"}} == 1'
        self._wait_until(
            lambda: bool(self.query(expr)),
            timeout_s,
            f"scraping {target}",
            stop_on_failure=False,
        )

    def wait_for(self, expr: str, timeout_s: float = 20.0) -> list[dict[str, Any]]:
        """Wait until ``expr`` returns a non-empty result; return it."""
        found: list[dict[str, Any]] = []

        def check() -> bool:
            found[:] = self.query(expr)
            return bool(found)

        self._wait_until(check, timeout_s, f"answering {expr}", stop_on_failure=False)
        return found


CLI = DetachedCli(
    STATE_NAME,
    lambda args: PrometheusServer(
        args.target, args.dir, rule_files=args.rules, alertmanagers=args.alertmanager
    ),
    b"prometheus",
)


def main(argv: Sequence[str] | None = None) -> int:
    """``start`` or ``stop`` a local Prometheus; return the exit code."""
    parser = mycroft_parser(
        "prometheus",
        "Start or stop a local Prometheus (Debian's package) that scrapes the "
        "given targets every second, left running between commands: for "
        "trying the dashboards and alerting rules against 'mycroft sinks'.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    common = MycroftParser(add_help=False)
    common.add_argument(
        "--dir",
        type=Path,
        default=state_dir() / "prometheus",
        help="work folder: config, TSDB, pid",
    )
    common.add_argument("--timeout", type=float, default=30.0, help="seconds to wait")
    start = sub.add_parser(
        "start",
        parents=[common],
        help="start it (or print the running one's URL)",
        description="Start it (or print the running one's URL).",
    )
    start.add_argument(
        "--target",
        action="append",
        default=[],
        help="host:port to scrape, repeatable",
    )
    start.add_argument(
        "--rules",
        action="append",
        default=[],
        type=Path,
        help="rule file, e.g. infra/prometheus/mycroft-alerts.yml",
    )
    start.add_argument(
        "--alertmanager",
        action="append",
        default=[],
        help="host:port of an Alertmanager to send alerts to",
    )
    sub.add_parser(
        "stop",
        parents=[common],
        help="stop the one of --dir",
        description="Stop the one of --dir.",
    )
    return run_cli(parser, CLI.run, argv)


if __name__ == "__main__":
    sys.exit(main())
