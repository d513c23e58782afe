"""A release as a user gets it, with no source tree in sight.

``./dev dist`` builds the wheel, the sdist and the NCCL plugin tarball; the
install of ``docs/deploy.md`` puts the wheel into a new venv; the commands
of that page then run from the venv, in a folder outside the repository;
the image's entrypoints (``infra/container/Containerfile``) run the
Kubernetes manifests' command lines for the agent, the stream worker and
the sinks against a local broker until the port their probes hit answers.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import tarfile
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "docs" / "deploy.md"
CONTAINERFILE = ROOT / "infra" / "container" / "Containerfile"
K8S = ROOT / "infra" / "k8s"
PLUGIN = "libnccl-profiler-mycroft.so"


def doc_block(heading: str) -> list[str]:
    """The command lines of the first ``bash`` block under ``heading``."""
    text = DEPLOY.read_text()
    after = text[text.index(f"\n{heading}\n") :]
    block = after[after.index("```bash\n") + 8 :]
    return [ln for ln in block[: block.index("```")].splitlines() if ln.strip()]


def clean_env(**extra: str) -> dict[str, str]:
    """The environment minus anything that could point Python at the source."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("PYTHON", "MYCROFT_", "VIRTUAL_ENV", "PIP_"))
    }
    return env | extra


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``./dev dist``, the page's first command, into a folder of its own."""
    (command,) = doc_block("## What a release ships")
    assert command == "./dev dist"
    readme = (ROOT / "README.md").read_text()
    assert "\n./dev dist    # dist/: the wheel, the sdist, and the NCCL" in readme
    out = tmp_path_factory.mktemp("dist")
    done = subprocess.run(
        ["bash", "-c", command],
        cwd=ROOT,
        env=os.environ | {"MYCROFT_DIST_DIR": str(out)},
        check=False,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return out


class Home:
    """A machine with the release installed as docs/deploy.md says."""

    def __init__(self, base: Path, dist: Path) -> None:
        self.base = base
        self.prefix = base / "opt-mycroft"
        self.work = base / "work"  # cwd: no source tree here
        self.work.mkdir()
        self.dist = dist

    def localize(self, line: str) -> str:
        """A line of the page, with its paths moved under this test's folder."""
        moves = {
            "/opt/mycroft": str(self.prefix),
            "dist/": f"{self.dist}/",
            "/tmp/": f"{self.work}/",
        }
        return re.sub("|".join(map(re.escape, moves)), lambda m: moves[m[0]], line)

    def run(self, line: str, **kw: Any) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["bash", "-c", self.localize(line)],
            cwd=self.work,
            env=clean_env(),
            check=False,
            capture_output=True,
            text=True,
            timeout=kw.pop("timeout", 300),
            **kw,
        )

    @property
    def mycroft(self) -> str:
        return str(self.prefix / "bin" / "mycroft")


@pytest.fixture(scope="module")
def home(dist: Path, tmp_path_factory: pytest.TempPathFactory) -> Home:
    """The page's venv and pip install, run as written (paths moved)."""
    h = Home(tmp_path_factory.mktemp("home"), dist)
    venv, install = doc_block("## On a host, with pip")[:2]
    assert venv.startswith("python3 -m venv ") and "pip install" in install
    for line in (venv, install):
        done = h.run(line, timeout=900)
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    return h


def test_the_wheel_and_sdist_hold_what_they_should(dist: Path, tmp_path: Path) -> None:
    (wheel,) = dist.glob("mycroft_trace-*.whl")
    (sdist,) = dist.glob("mycroft_trace-*.tar.gz")
    (plugin,) = dist.glob("mycroft-nccl-plugin-*.tar.gz")
    import zipfile  # noqa: PLC0415

    names = zipfile.ZipFile(wheel).namelist()
    assert "mycroft/schemas/state.avsc" in names
    assert not [n for n in names if n.endswith((".c", ".h", "Makefile"))]
    with tarfile.open(sdist) as tf:
        members = tf.getnames()
        tf.extractall(tmp_path, filter="data")
    top = sdist.name.removesuffix(".tar.gz")
    for path in (
        "pyproject.toml",
        "producers/nccl/src/plugin.c",
        "producers/nccl/Makefile",
    ):
        assert f"{top}/{path}" in members
    # the plugin builds from the sdist alone, as docs/deploy.md says
    build = tmp_path / "build"
    done = subprocess.run(
        [
            "make",
            "-s",
            "-C",
            str(tmp_path / top / "producers" / "nccl"),
            f"BUILD={build}",
            f"{build}/{PLUGIN}",
        ],
        check=False,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert (build / PLUGIN).is_file()
    with tarfile.open(plugin) as tf:
        assert any(n.endswith(f"/lib/{PLUGIN}") for n in tf.getnames())


def test_the_installed_package_comes_from_the_venv(home: Home) -> None:
    done = home.run(
        "/opt/mycroft/bin/python -c 'import sys, mycroft, mycroft.streams.core;"
        "print(mycroft.__file__); print(sys.path)'"
    )
    assert done.returncode == 0, done.stderr
    first, path = done.stdout.splitlines()
    assert first.startswith(str(home.prefix))
    assert str(ROOT) not in path


def test_the_pages_commands_run_from_the_wheel(home: Home) -> None:
    lines = doc_block("## On a host, with pip")[2:]
    help_, simulate, analyze = lines
    done = home.run(help_)
    assert done.returncode == 0 and "agent" in done.stdout, done.stderr
    done = home.run(simulate)
    assert done.returncode == 0, done.stderr
    done = home.run(analyze)
    assert done.returncode == 3, done.stderr  # a culprit, as the page says
    found = json.loads(done.stdout)["root_causes"][0]
    truth = json.loads((home.work / "truth.json").read_text())["faults"][0]
    assert (found["rank"], found["component"]) == (truth["rank"], truth["component"])
    assert "rank 4" in DEPLOY.read_text() and truth["rank"] == 4


def image_env() -> dict[str, str]:
    """ENV of the Containerfile's runtime stage."""
    text = re.sub(r"\\\n\s*", " ", CONTAINERFILE.read_text())
    runtime = text[text.rindex("\nFROM ") :]
    env: dict[str, str] = {}
    for line in runtime.splitlines():
        if line.startswith("ENV "):
            env.update(kv.split("=", 1) for kv in line[4:].split())
    return env


def image_entrypoint() -> list[str]:
    (line,) = [
        ln
        for ln in CONTAINERFILE.read_text().splitlines()
        if ln.startswith("ENTRYPOINT ")
    ]
    entry: list[str] = json.loads(line.split(None, 1)[1])
    return entry


def test_the_plugin_tarball_is_where_the_image_puts_it(
    home: Home, tmp_path: Path
) -> None:
    (plugin,) = home.dist.glob("mycroft-nccl-plugin-*.tar.gz")
    with tarfile.open(plugin) as tf:
        tf.extractall(tmp_path, filter="data")
    (lib,) = tmp_path.glob(f"*/lib/{PLUGIN}")
    image = image_env()["MYCROFT_NCCL_BUILD"]
    env = clean_env(MYCROFT_NCCL_BUILD=str(lib.parent))
    done = subprocess.run(
        [home.mycroft, "nccl-plugin", "path"],
        env=env,
        cwd=home.work,
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(lib)
    assert image == "/opt/mycroft/nccl"
    # NCCL finds the profiler's entry points in it
    probe = f"import ctypes; lib = ctypes.CDLL({str(lib)!r}); lib.ncclProfiler_v6"
    assert (
        subprocess.run(
            [sys.executable, "-c", probe], check=False, timeout=60
        ).returncode
        == 0
    )
    # without the image's setting the wheel says how to get one
    done = subprocess.run(
        [home.mycroft, "nccl-plugin", "path"],
        env=clean_env(),
        cwd=home.work,
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1 and "make -C" in done.stderr


def test_the_images_commands_run_from_the_wheel(home: Home) -> None:
    """``docker run IMAGE ARGS`` of the page is ENTRYPOINT + ARGS in the venv."""
    assert image_entrypoint() == ["mycroft"]
    runs = [ln for ln in doc_block("## The image") if ln.startswith("docker run ")]
    assert len(runs) == 3
    for line in runs:
        args = line.split()[4:]  # docker run --rm IMAGE ...
        done = subprocess.run(
            [home.mycroft, *args],
            env=clean_env(),
            cwd=home.work,
            check=False,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0 and "usage: mycroft" in done.stdout, line


# -- the manifests' command lines, live ------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _container(path: Path, kind: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """(pod spec, first container) of the workload of ``kind`` in ``path``."""
    (work,) = [
        o for o in yaml.safe_load_all(path.read_text()) if o and o["kind"] == kind
    ]
    pod = work["spec"]["template"]["spec"]
    return pod, pod["containers"][0]


class Pod:
    """One manifest container, run as the image would run it, on this host."""

    def __init__(self, home: Home, root: Path, bootstrap: str, tag: str) -> None:
        self.home, self.root, self.bootstrap, self.tag = home, root, bootstrap, tag
        for sub in ("etc/mycroft/kafka", "var/lib", "dev/shm/mycroft", "tmp"):
            (root / sub).mkdir(parents=True, exist_ok=True)
        config = yaml.safe_load((K8S / "config.yaml").read_text())
        toml = re.sub(
            r'^bootstrap = ".*"$',
            f'bootstrap = "{bootstrap}"',
            config["data"]["mycroft.toml"],
            flags=re.M,
        )
        (root / "etc/mycroft/mycroft.toml").write_text(self.local(toml))
        (root / "etc/mycroft/kafka/security.toml").write_text(
            'security_protocol = "PLAINTEXT"\n'
        )

    def local(self, text: str) -> str:
        """The pod's absolute paths, under this test's folder."""
        paths = ("/etc/mycroft", "/var/lib", "/dev/shm/mycroft", "/tmp")
        pattern = "|".join(re.escape(p) for p in paths)
        return re.sub(f"(?<![\\w/])({pattern})", lambda m: f"{self.root}{m[1]}", text)

    def start(self, container: dict[str, Any]) -> tuple[subprocess.Popen[str], int]:
        """The container's args with the image's ENTRYPOINT and ENV."""
        env = {k: v for k, v in image_env().items()}
        for item in container.get("env", []):
            env[item["name"]] = item.get("value", "node-test")  # valueFrom: a name
        entry = [str(self.home.prefix / "bin" / e) for e in image_entrypoint()]
        return self.launch([*entry, *container["args"]], env)

    def launch(
        self, argv: list[str], env_extra: dict[str, str]
    ) -> tuple[subprocess.Popen[str], int]:
        """Run ``argv`` with its paths and metrics port moved, on its own topics."""
        argv = [argv[0], *[self.local(a) for a in argv[1:]]]
        port = _free_port()
        for i, arg in enumerate(argv[:-1]):
            if arg == "--metrics-port":
                argv[i + 1] = str(port)
            if arg == "--prometheus-listen":
                argv[i + 1] = f"127.0.0.1:{port}"
        env = clean_env(**{k: self.local(v) for k, v in env_extra.items()})
        # a namespace of their own on the shared test broker
        env |= {
            "MYCROFT_AGENT__TOPIC_PREFIX": self.tag,
            "MYCROFT_STREAMS__PREFIX": self.tag,
            "MYCROFT_STREAMS__APP_ID": f"app-{self.tag}",
            "MYCROFT_SINKS__TOPIC_PREFIX": self.tag,
            "MYCROFT_SINKS__GROUP": f"sinks-{self.tag}",
            "MYCROFT_SINKS__LAG_GROUP": f"app-{self.tag}",
        }
        with (self.root / f"{argv[1]}.log").open("w") as log:
            proc = subprocess.Popen(
                argv,
                env=env,
                cwd=self.root / "tmp",
                stdout=log,
                stderr=subprocess.STDOUT,
                text=True,
            )
        return proc, port


def _wait_metrics(proc: subprocess.Popen[str], port: int, limit_s: float) -> None:
    end = time.monotonic() + limit_s
    while time.monotonic() < end:
        assert proc.poll() is None, f"exited {proc.returncode} before serving /metrics"
        try:
            with urllib.request.urlopen(
                f"http://127.0.0.1:{port}/metrics", timeout=2
            ) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.5)
    pytest.fail(f"no /metrics on port {port} within {limit_s:.0f} s")


def _probe_budget_s(container: dict[str, Any]) -> float:
    probe = container["startupProbe"]
    return float(probe["periodSeconds"] * probe["failureThreshold"])


def test_the_manifests_commands_serve_their_probes(
    home: Home, kafka_bootstrap: str, tmp_path: Path
) -> None:
    """Worker, sinks and agent, with the manifests' args, ConfigMap and a
    security file of the Secret's shape: each answers its probe's /metrics
    within the startup probe's budget and stops with 0 on SIGTERM within its
    grace period."""
    tag = f"deploy{uuid.uuid4().hex[:8]}"
    pods = Pod(home, tmp_path, kafka_bootstrap, tag)
    order = [
        (K8S / "streams-worker.yaml", "Deployment"),
        (K8S / "sinks.yaml", "Deployment"),
        (K8S / "agent-daemonset.yaml", "DaemonSet"),
    ]
    running: list[tuple[subprocess.Popen[str], float, str]] = []
    try:
        for path, kind in order:
            pod, container = _container(path, kind)
            proc, port = pods.start(container)
            running.append((proc, pod["terminationGracePeriodSeconds"], path.name))
            _wait_metrics(proc, port, _probe_budget_s(container))
        for proc, grace_s, name in reversed(running):
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(grace_s) == 0, name
    finally:
        for proc, _, _ in running:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
        for log in tmp_path.glob("*.log"):
            print(f"--- {log.name}\n{log.read_text()[-2000:]}")


def _unit(name: str) -> tuple[list[str], dict[str, str], float]:
    """(ExecStart argv, Environment=, TimeoutStopSec) of an infra/systemd unit."""
    lines = (ROOT / "infra" / "systemd" / name).read_text().splitlines()
    (exec_start,) = [ln for ln in lines if ln.startswith("ExecStart=")]
    env = dict(
        ln.removeprefix("Environment=").split("=", 1)
        for ln in lines
        if ln.startswith("Environment=")
    )
    (stop,) = [ln for ln in lines if ln.startswith("TimeoutStopSec=")]
    return exec_start.removeprefix("ExecStart=").split(), env, float(stop[15:])


def test_the_systemd_units_commands_serve_metrics(
    home: Home, kafka_bootstrap: str, tmp_path: Path
) -> None:
    """Each unit's ExecStart, with its Environment= and a settings file of
    the kind its comment names, serves /metrics and stops with 0 on SIGTERM
    within TimeoutStopSec."""
    pods = Pod(home, tmp_path, kafka_bootstrap, f"unit{uuid.uuid4().hex[:8]}")
    running: list[tuple[subprocess.Popen[str], float, str]] = []
    try:
        for unit in ("mycroft-streams.service", "mycroft-sinks.service",
                     "mycroft-agent.service"):  # fmt: skip
            argv, env, stop_s = _unit(unit)
            assert argv[0] == "/usr/local/bin/mycroft"
            section = argv[1]
            config = Path(pods.local(env["MYCROFT_CONFIG"]))
            config.write_text(f'[{section}]\nbootstrap = "{kafka_bootstrap}"\n')
            for path in argv:  # the units' StateDirectory=, made by systemd
                if path.startswith("/var/lib/"):
                    Path(pods.local(path)).mkdir(parents=True, exist_ok=True)
            proc, port = pods.launch([home.mycroft, *argv[1:]], env)
            running.append((proc, stop_s, unit))
            _wait_metrics(proc, port, 120)
        for proc, stop_s, unit in reversed(running):
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(stop_s) == 0, unit
    finally:
        for proc, _, _ in running:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
        for log in tmp_path.glob("*.log"):
            print(f"--- {log.name}\n{log.read_text()[-2000:]}")
