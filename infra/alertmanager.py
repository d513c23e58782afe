"""Run a real Alertmanager (Debian's ``prometheus-alertmanager``) on loopback.

``./dev setup`` installs it next to Prometheus (``apt-get install -y
--no-install-recommends prometheus-alertmanager``); the package's systemd
service is not used. Each :class:`AlertmanagerServer` writes its own config
and data folder, listens on a free loopback port and runs without clustering.
Alerts are grouped by ``alertname`` and ``job_id`` and sent, with their
resolution, to one webhook; :meth:`AlertmanagerServer.alerts` reads what it
holds through its v2 API.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
import urllib.request
from pathlib import Path
from typing import Any

from mycroft.errors import MycroftError
from mycroft.infra import _kafka_props as kp
from mycroft.infra._service import LocalService

__all__ = ["AlertmanagerError", "AlertmanagerServer", "find_binary", "render_config"]

logger = logging.getLogger(__name__)

INSTALL_HINT = "apt-get install -y --no-install-recommends prometheus-alertmanager"


class AlertmanagerError(MycroftError):
    """Alertmanager is missing, failed to start, or its API failed."""


def find_binary() -> str:
    """``$MYCROFT_ALERTMANAGER_BIN``, ``prometheus-alertmanager`` or ``alertmanager``.

    Raises:
        AlertmanagerError: not found; the message says how to install it.
    """
    found = (
        os.environ.get("MYCROFT_ALERTMANAGER_BIN")
        or shutil.which("prometheus-alertmanager")
        or shutil.which("alertmanager")
    )
    if not found:
        raise AlertmanagerError(f"Alertmanager is not on PATH; {INSTALL_HINT}")
    return found


def render_config(webhook_url: str | None, group_wait_s: float = 1.0) -> str:
    """alertmanager.yml: every alert to ``webhook_url`` (none: kept, not sent)."""
    receiver: dict[str, Any] = {"name": "mycroft"}
    if webhook_url:
        receiver["webhook_configs"] = [{"url": webhook_url, "send_resolved": True}]
    config = {
        "route": {
            "receiver": "mycroft",
            "group_by": ["alertname", "job_id"],
            "group_wait": f"{group_wait_s:g}s",
            "group_interval": f"{group_wait_s:g}s",
            "repeat_interval": "1h",
        },
        "receivers": [receiver],
    }
    return json.dumps(config, indent=2) + "\n"


class AlertmanagerServer(LocalService):
    """One Alertmanager on ``127.0.0.1:<free port>``.

    Args:
        webhook_url: where notifications go (``http://127.0.0.1:PORT/...``).
        workdir: config and data folder; a new temporary one if None.
        keep: keep a temporary ``workdir`` after :meth:`close`.
    """

    display_name = "Alertmanager"
    log_name = "alertmanager.log"
    error = AlertmanagerError

    def __init__(
        self,
        webhook_url: str | None,
        workdir: Path | None = None,
        *,
        keep: bool = False,
    ) -> None:
        super().__init__(workdir, keep=keep, prefix="mycroft-alertmanager-")
        self.webhook_url = webhook_url
        self._port: int | None = None

    @property
    def address(self) -> str:
        """``127.0.0.1:PORT``, as Prometheus' ``alertmanagers`` targets want it."""
        if self._port is None:
            raise AlertmanagerError("Alertmanager has no port yet; call start() first")
        return f"{kp.HOST}:{self._port}"

    @property
    def url(self) -> str:
        """``http://127.0.0.1:PORT``."""
        return f"http://{self.address}"

    def start(self, timeout_s: float = 30.0, *, detach: bool = False) -> str:
        """Start it and wait for ``/-/ready``; return the URL.

        Raises:
            AlertmanagerError: no binary, it exited, or was not ready in time.
        """
        if self.pid is not None:
            return self.url
        binary = find_binary()
        self.workdir.mkdir(parents=True, exist_ok=True)
        config = self.workdir / "alertmanager.yml"
        config.write_text(render_config(self.webhook_url), "utf-8")
        if self._port is None:
            self._port = kp.pick_free_ports().client
        cmd = [binary, f"--config.file={config}",
               f"--storage.path={self.workdir / 'data'}",
               f"--web.listen-address={self.address}",
               "--cluster.listen-address=", "--log.level=warn"]  # fmt: skip
        started = time.monotonic()
        self._popen(cmd, detach)
        self._wait_until(self._ready, timeout_s)
        self.startup_s = time.monotonic() - started
        logger.info("Alertmanager ready at %s in %.2f s", self.url, self.startup_s)
        return self.url

    def _ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as resp:  # noqa: S310 (our http URL)
                return int(resp.status) == 200
        except (OSError, ValueError):
            return False

    def alerts(self) -> list[dict[str, Any]]:
        """The alerts it holds now (v2 API: ``labels``, ``annotations``, ``status``).

        Raises:
            AlertmanagerError: the API did not answer.
        """
        url = f"{self.url}/api/v2/alerts"
        try:
            with urllib.request.urlopen(url, timeout=10) as resp:  # noqa: S310 (our http URL)
                found: list[dict[str, Any]] = json.load(resp)
        except (OSError, ValueError) as exc:
            raise AlertmanagerError(f"GET {url}: {exc}") from exc
        return found
