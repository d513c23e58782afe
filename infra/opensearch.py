"""Run a real single-node OpenSearch 2.19.x from the Maven Central integ-test zip.

The zip (``org.opensearch.distribution.integ-test-zip:opensearch:<ver>:zip``,
about 55 MB, no bundled JDK, no plugins, so plain HTTP without auth) is
unpacked once into ``.cache/opensearch-<ver>``. Each :class:`OpenSearchServer`
gets its own work folder (config copy, data, logs) and two free loopback
ports. OpenSearch refuses to run as root, so as root it runs as a system user
(``ostest``; created with ``useradd`` when absent) that owns the work folder.
Java 17 is enough: 3.x would need Java 21. CLI::

    mycroft opensearch fetch
    mycroft opensearch start   # prints the URL
    mycroft opensearch stop
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path

from mycroft.cli_parser import MycroftParser, mycroft_parser
from mycroft.config import state_dir
from mycroft.errors import MycroftError
from mycroft.infra import _kafka_props as kp
from mycroft.infra._service import DetachedCli, LocalService, run_cli

__all__ = ["OpenSearchError", "OpenSearchServer", "fetch_distribution", "main"]

logger = logging.getLogger(__name__)

VERSION = "2.19.6"
ARTIFACT = f"org.opensearch.distribution.integ-test-zip:opensearch:{VERSION}:zip"
DEPENDENCY_PLUGIN = "org.apache.maven.plugins:maven-dependency-plugin:3.6.1"
DEFAULT_USER = "ostest"
STATE_NAME = "opensearch.json"


class OpenSearchError(MycroftError):
    """OpenSearch could not be fetched, started, reached or stopped."""


def default_cache_dir(env: Mapping[str, str] | None = None) -> Path:
    """``$MYCROFT_CACHE_DIR/opensearch-<ver>``, else ``<repo or cwd>/.cache/...``."""
    env = os.environ if env is None else env
    name = f"opensearch-{VERSION}"
    if env.get("MYCROFT_CACHE_DIR"):
        return Path(env["MYCROFT_CACHE_DIR"]).expanduser() / name
    repo = Path(__file__).resolve().parent.parent
    base = repo if (repo / "pyproject.toml").is_file() else Path.cwd()
    return base / ".cache" / name


def fetch_distribution(cache_dir: Path | None = None) -> Path:
    """Unpack the distribution with Maven once; return its home folder.

    Raises:
        OpenSearchError: mvn is missing or failed (the message holds its output).
    """
    cache = (cache_dir or default_cache_dir()).resolve()
    home = cache / f"opensearch-{VERSION}"
    marker = cache / ".complete"
    if marker.is_file():
        return home
    cache.mkdir(parents=True, exist_ok=True)
    with kp.file_lock(cache / ".lock"):
        if marker.is_file():
            return home
        mvn = _require("mvn", "apt-get install -y maven openjdk-17-jre-headless")
        staging = Path(tempfile.mkdtemp(prefix="unpack-", dir=cache))
        cmd = [mvn, "-B", "-q", f"{DEPENDENCY_PLUGIN}:unpack", f"-Dartifact={ARTIFACT}",
               f"-DoutputDirectory={staging}"]  # fmt: skip
        logger.info("fetching OpenSearch %s with Maven into %s", VERSION, cache)
        started = time.monotonic()
        done = subprocess.run(
            cmd, cwd=staging, capture_output=True, text=True, timeout=900, check=False
        )
        if done.returncode != 0 or not (staging / home.name / "bin").is_dir():
            shutil.rmtree(staging, ignore_errors=True)
            out = (done.stdout + done.stderr)[-3000:]
            raise OpenSearchError(f"mvn could not fetch {ARTIFACT}:\n{out}")
        shutil.rmtree(home, ignore_errors=True)
        (staging / home.name).rename(home)
        shutil.rmtree(staging, ignore_errors=True)
        marker.write_text(f"{ARTIFACT}\n", "utf-8")
        logger.info("fetched OpenSearch in %.1f s", time.monotonic() - started)
    return home


def _require(tool: str, hint: str) -> str:
    found = shutil.which(tool)
    if found is None:
        raise OpenSearchError(f"{tool!r} is not on PATH; install it ({hint})")
    return found


def java_home(env: Mapping[str, str] | None = None) -> str:
    """``OPENSEARCH_JAVA_HOME`` or ``JAVA_HOME``, else derived from ``java`` on PATH."""
    env = os.environ if env is None else env
    for key in ("OPENSEARCH_JAVA_HOME", "JAVA_HOME"):
        if env.get(key):
            return env[key]
    java = Path(_require("java", "apt-get install -y openjdk-17-jre-headless"))
    return str(java.resolve().parent.parent)


def ensure_user(name: str = DEFAULT_USER) -> pwd.struct_passwd:
    """Return the passwd entry of system user ``name``, creating it when absent.

    Raises:
        OpenSearchError: useradd failed (not root, or no useradd).
    """
    with contextlib.suppress(KeyError):
        return pwd.getpwnam(name)
    useradd = _require("useradd", "apt-get install -y passwd")
    cmd = [useradd, "-r", "-M", "-s", "/usr/sbin/nologin", name]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if done.returncode not in (0, 9):  # 9: created meanwhile by someone else
        raise OpenSearchError(f"useradd {name} failed: {done.stderr.strip()}")
    return pwd.getpwnam(name)


def _absolute_jvm_paths(options: Path, workdir: Path) -> None:
    """Point gc log, heap dumps and error files into ``workdir``.

    The launcher runs from the (root-owned, shared) distribution folder, so the
    relative ``logs/`` and ``data`` paths of the stock file are not writable.
    """
    text = options.read_text("utf-8")
    text = text.replace("logs/", f"{workdir}/logs/")
    text = text.replace("HeapDumpPath=data", f"HeapDumpPath={workdir}/data")
    text = text.replace("filecount=32,filesize=64m", "filecount=2,filesize=8m")
    options.write_text(text, "utf-8")


def _chown_tree(root: Path, uid: int, gid: int) -> None:
    os.chown(root, uid, gid)
    for path in root.rglob("*"):
        os.chown(path, uid, gid, follow_symlinks=False)


class OpenSearchServer(LocalService):
    """A single-node OpenSearch on loopback; HTTP without auth.

    Args:
        workdir: folder for config, data and logs; a new temporary one if None.
        heap_mb: JVM heap (-Xms and -Xmx) in MiB.
        cache_dir: where the distribution is; :func:`default_cache_dir` if None.
        user: who runs it when we are root (default ``ostest``, or
            ``$MYCROFT_OPENSEARCH_USER``); ignored when not root.
        keep: keep a temporary ``workdir`` after :meth:`close`.
    """

    display_name = "OpenSearch"
    log_name = "opensearch.out"  # its own logs are in logs/
    error = OpenSearchError

    def __init__(
        self,
        workdir: Path | None = None,
        *,
        heap_mb: int = 512,
        cache_dir: Path | None = None,
        user: str | None = None,
        keep: bool = False,
    ) -> None:
        super().__init__(workdir, keep=keep, prefix="mycroft-opensearch-")
        self._heap_mb = heap_mb
        self._cache_dir = cache_dir
        self._user = user or os.environ.get("MYCROFT_OPENSEARCH_USER") or DEFAULT_USER
        self._ports: kp.BrokerPorts | None = None

    @property
    def url(self) -> str:
        """``http://127.0.0.1:PORT``; fixed after the first start."""
        if self._ports is None:
            raise OpenSearchError("OpenSearch has no port yet; call start() first")
        return f"http://{kp.HOST}:{self._ports.client}"

    def start(self, timeout_s: float = 120.0, *, detach: bool = False) -> str:
        """Start it and wait for cluster health yellow; return the URL.

        Raises:
            OpenSearchError: fetch, user or java failed, the JVM exited, or it
                was not ready in time (the message holds the log tail).
        """
        if self.pid is not None:
            return self.url
        home = fetch_distribution(self._cache_dir)
        cmd, env = self._prepare(home)
        started = time.monotonic()
        account = pwd.getpwnam(self._user) if os.geteuid() == 0 else None
        self._popen(
            cmd, detach, env=env,
            user=None if account is None else account.pw_uid,
            group=None if account is None else account.pw_gid,
            extra_groups=None if account is None else [],
        )  # fmt: skip
        self._wait_until(self.healthy, timeout_s, "healthy")
        self.startup_s = time.monotonic() - started
        logger.info("OpenSearch ready at %s in %.1f s", self.url, self.startup_s)
        return self.url

    def _prepare(self, home: Path) -> tuple[list[str], dict[str, str]]:
        if self._ports is None:
            self._ports = kp.pick_free_ports()
        conf = self.workdir / "config"
        if not conf.is_dir():
            shutil.copytree(home / "config", conf)
            _absolute_jvm_paths(conf / "jvm.options", self.workdir)
        for sub in ("data", "logs", "tmp"):
            (self.workdir / sub).mkdir(parents=True, exist_ok=True)
        if os.geteuid() == 0:
            account = ensure_user(self._user)
            _chown_tree(self.workdir, account.pw_uid, account.pw_gid)
        jhome = java_home()
        heap = f"-Xms{self._heap_mb}m -Xmx{self._heap_mb}m"
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(self.workdir),
            "JAVA_HOME": jhome, "OPENSEARCH_JAVA_HOME": jhome,
            "OPENSEARCH_PATH_CONF": str(conf), "OPENSEARCH_JAVA_OPTS": heap,
            "OPENSEARCH_TMPDIR": str(self.workdir / "tmp"),
        }  # fmt: skip
        w, p = self.workdir, self._ports
        settings = {
            "cluster.name": "mycroft-test", "node.name": "node-1",
            "discovery.type": "single-node", "network.host": kp.HOST,
            "http.port": p.client, "transport.port": p.controller,
            "path.data": w / "data", "path.logs": w / "logs",
            "cluster.routing.allocation.disk.threshold_enabled": "false",
        }  # fmt: skip
        cmd = [str(home / "bin" / "opensearch")]
        cmd += [f"-E{key}={value}" for key, value in settings.items()]
        return cmd, env

    def healthy(self) -> bool:
        """Whether cluster health is at least yellow."""
        if self._ports is None or not kp.tcp_open(kp.HOST, self._ports.client):
            return False
        url = f"{self.url}/_cluster/health?wait_for_status=yellow&timeout=1s"
        try:
            with urllib.request.urlopen(url, timeout=3) as resp:  # noqa: S310 (http URL we built)
                return int(resp.status) == 200
        except (OSError, ValueError):
            return False


CLI = DetachedCli(
    STATE_NAME,
    lambda args: OpenSearchServer(args.dir, heap_mb=args.heap_mb),
    b"opensearch",
)


def _cmd(args: argparse.Namespace) -> int:
    if args.command == "fetch":
        print(fetch_distribution())
        return 0
    return CLI.run(args)


def main(argv: Sequence[str] | None = None) -> int:
    """``fetch``, ``start`` or ``stop`` a local OpenSearch; return the exit code."""
    parser = mycroft_parser(
        "opensearch",
        "Fetch, start or stop a local single-node OpenSearch (plain HTTP, no "
        "auth) left running between commands: for trying 'mycroft sinks "
        "--opensearch-url'.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    common = MycroftParser(add_help=False)
    common.add_argument(
        "--dir",
        type=Path,
        default=state_dir() / "opensearch",
        help="work folder: config, data, logs, pid",
    )
    common.add_argument("--timeout", type=float, default=120.0, help="seconds to wait")
    sub.add_parser(
        "fetch",
        parents=[common],
        help="download and unpack the distribution once",
        description="Download and unpack the distribution once.",
    )
    start = sub.add_parser(
        "start",
        parents=[common],
        help="start it (or print the running one's URL)",
        description="Start it (or print the running one's URL).",
    )
    start.add_argument("--heap-mb", type=int, default=512, help="JVM max heap, MiB")
    sub.add_parser(
        "stop",
        parents=[common],
        help="stop the one of --dir",
        description="Stop the one of --dir.",
    )
    return run_cli(parser, _cmd, argv)


if __name__ == "__main__":
    sys.exit(main())
