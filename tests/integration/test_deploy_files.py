"""The deployment files are valid for the tools that will read them.

* ``infra/k8s``: ``kustomize build`` (single-stage, and with the two-stage
  component), then kubeconform ``-strict`` against JSON schemas made here from
  Kubernetes' own OpenAPI spec (``api/openapi-spec/swagger.json`` of the
  ``k8s.io/kubernetes`` Go module, which ``./dev setup`` downloads through the
  Go module proxy: kubeconform's default schema host is not reachable from CI);
  then the policies every Mycroft pod keeps (non-root, read-only root, no
  capabilities, resources, probes on a declared port, Kafka security from a
  Secret).
* ``infra/container/Containerfile``: hadolint, and the facts the manifests
  and docs rely on (non-root user, entrypoint, ports, the plugin's path).
* ``infra/systemd``: ``systemd-analyze verify``, with no warning.

The commands these files run are run for real in ``test_packaging.py``.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.services import unavailable

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "infra" / "k8s"
CONTAINERFILE = ROOT / "infra" / "container" / "Containerfile"
SYSTEMD = ROOT / "infra" / "systemd"
TOOLS = ROOT / ".cache" / "bin"
K8S_API = "k8s.io/kubernetes@v1.37.2"  # ./dev: K8S_API
SWAGGER = (
    ROOT / ".cache" / "go" / "mod" / K8S_API / "api" / "openapi-spec" / "swagger.json"
)


def _tool(name: str) -> str:
    """A tool from .cache/bin (Go), the venv's scripts (PyPI) or PATH."""
    for path in (TOOLS / name, Path(sys.executable).parent / name):
        if path.is_file():
            return str(path)
    found = shutil.which(name)
    if found is None:
        unavailable(name, f"no {name} in {TOOLS}, the venv or PATH: run ./dev setup")
    return found


def _run(cmd: list[str], **kw: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        cmd, check=False, capture_output=True, text=True, timeout=120, **kw
    )


# -- Kubernetes: schemas from the OpenAPI spec -----------------------------------


def _int_or_string(node: Any) -> Any:
    """kubeconform's openapi2jsonschema: ``int-or-string`` is a string or an int."""
    if isinstance(node, dict):
        if node.get("format") == "int-or-string":
            return {"oneOf": [{"type": "string"}, {"type": "integer"}]}
        return {k: _int_or_string(v) for k, v in node.items()}
    if isinstance(node, list):
        return [_int_or_string(v) for v in node]
    return node


def _strict(node: Any) -> None:
    """No property a schema does not name (kubectl's validation, ``-strict``)."""
    if isinstance(node, dict):
        if "properties" in node:
            node.setdefault("additionalProperties", False)
        for value in node.values():
            _strict(value)
    elif isinstance(node, list):
        for value in node:
            _strict(value)


def _refs(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        ref = node.get("$ref")
        if isinstance(ref, str):
            yield ref.rsplit("/", 1)[-1]
        for value in node.values():
            yield from _refs(value)
    elif isinstance(node, list):
        for value in node:
            yield from _refs(value)


def standalone_schema(definitions: dict[str, Any], name: str) -> dict[str, Any]:
    """One kind's schema with every definition it refers to, made strict."""
    needed, todo = {name}, [name]
    while todo:
        for ref in _refs(definitions[todo.pop()]):
            if ref not in needed:
                needed.add(ref)
                todo.append(ref)
    defs = {n: _int_or_string(json.loads(json.dumps(definitions[n]))) for n in needed}
    # resource.Quantity: "500m" or 2 (openapi2jsonschema does the same)
    for n in needed:
        if n.endswith(".api.resource.Quantity"):
            defs[n] = {"oneOf": [{"type": "string"}, {"type": "number"}]}
    schema = dict(defs[name])
    schema["definitions"] = defs
    _strict(schema)
    schema["additionalProperties"] = False
    return schema


def kind_file(api_version: str, kind: str) -> str:
    """kubeconform's file name: ``{{ .ResourceKind }}{{ .KindSuffix }}.json``."""
    group_version = api_version.split("/")
    suffix = "-" + group_version[0].split(".")[0].lower()
    if len(group_version) > 1:
        suffix += "-" + group_version[1].lower()
    return f"{kind.lower()}{suffix}.json"


@pytest.fixture(scope="module")
def schema_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """kubeconform schemas of every kind the spec defines, written on demand."""
    if not SWAGGER.is_file():
        unavailable("Kubernetes OpenAPI spec", f"no {SWAGGER}: run ./dev setup")
    definitions = json.loads(SWAGGER.read_text())["definitions"]
    out = tmp_path_factory.mktemp("k8s-schemas")
    for name, body in definitions.items():
        for gvk in body.get("x-kubernetes-group-version-kind", []):
            group, version, kind = gvk["group"], gvk["version"], gvk["kind"]
            api = f"{group}/{version}" if group else version
            if kind in KINDS_USED:
                path = out / kind_file(api, kind)
                path.write_text(json.dumps(standalone_schema(definitions, name)))
    return out


KINDS_USED = {
    "Pod",
    "Namespace",
    "ConfigMap",
    "Secret",
    "Service",
    "DaemonSet",
    "Deployment",
    "PodDisruptionBudget",
}


def kustomize_build(root: Path) -> str:
    done = _run([_tool("kustomize"), "build", str(root)])
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.fixture(scope="module")
def two_stage_tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """infra/k8s with its two-stage component enabled, as the docs say."""
    tree = tmp_path_factory.mktemp("k8s") / "k8s"
    shutil.copytree(K8S, tree)
    kustomization = tree / "kustomization.yaml"
    text = kustomization.read_text()
    assert "# components:\n#   - two-stage\n" in text
    kustomization.write_text(
        text.replace("# components:\n#   - two-stage\n", "components:\n  - two-stage\n")
    )
    return tree


def kubeconform(schema_dir: Path, manifests: str) -> subprocess.CompletedProcess[str]:
    location = str(schema_dir / "{{ .ResourceKind }}{{ .KindSuffix }}.json")
    return _run(
        [
            _tool("kubeconform"),
            "-strict",
            "-summary",
            "-output",
            "json",
            "-schema-location",
            location,
            "-",
        ],
        input=manifests,
    )


def _summary(done: subprocess.CompletedProcess[str]) -> dict[str, int]:
    summary: dict[str, int] = json.loads(done.stdout)["summary"]
    return summary


@pytest.mark.parametrize("layout", ["single-stage", "two-stage"])
def test_manifests_are_valid_kubernetes(
    layout: str, schema_dir: Path, two_stage_tree: Path
) -> None:
    built = kustomize_build(K8S if layout == "single-stage" else two_stage_tree)
    done = kubeconform(schema_dir, built)
    assert done.returncode == 0, done.stdout + done.stderr
    summary = _summary(done)
    assert summary["invalid"] == summary["errors"] == summary["skipped"] == 0
    assert summary["valid"] == len(list(yaml.safe_load_all(built)))


def test_the_example_secrets_are_valid(schema_dir: Path) -> None:
    done = kubeconform(schema_dir, (K8S / "kafka-secrets.example.yaml").read_text())
    assert done.returncode == 0, done.stdout + done.stderr
    assert _summary(done)["valid"] == 3


def test_the_example_secrets_hold_security_files_mycroft_reads(tmp_path: Path) -> None:
    """Each role's security.toml parses as --kafka-security-file reads it."""
    from mycroft.kafka_security import security_from  # noqa: PLC0415

    text = (K8S / "kafka-secrets.example.yaml").read_text()
    for secret in yaml.safe_load_all(text):
        role = secret["metadata"]["name"].removeprefix("mycroft-kafka-")
        data = secret["stringData"]
        ca = tmp_path / f"{role}-ca.crt"
        ca.write_text(data["ca.crt"])
        path = tmp_path / f"{role}.toml"
        path.write_text(
            data["security.toml"].replace("/etc/mycroft/kafka/ca.crt", str(ca))
        )
        sec = security_from({"kafka_security_file": str(path)}, {}, "MYCROFT_")
        assert (sec.protocol, sec.username) == ("SASL_SSL", role)
        assert sec.password.reveal() == "change-me"


def test_kubeconform_rejects_a_misspelled_field(schema_dir: Path) -> None:
    """The schemas are strict and in use: a typo in a security context fails."""
    bad = kustomize_build(K8S).replace(
        "readOnlyRootFilesystem", "readOnlyRootFileSystem", 1
    )
    done = kubeconform(schema_dir, bad)
    assert done.returncode != 0
    assert _summary(done)["invalid"] == 1
    assert "readOnlyRootFileSystem" in done.stdout


def _objects(built: str) -> list[dict[str, Any]]:
    return [o for o in yaml.safe_load_all(built) if o]


def _workloads(built: str) -> list[dict[str, Any]]:
    return [o for o in _objects(built) if o["kind"] in ("DaemonSet", "Deployment")]


def _flag(args: list[str], name: str) -> str | None:
    return args[args.index(name) + 1] if name in args else None


@pytest.mark.parametrize("layout", ["single-stage", "two-stage"])
def test_every_pod_keeps_the_policies(layout: str, two_stage_tree: Path) -> None:
    built = kustomize_build(K8S if layout == "single-stage" else two_stage_tree)
    names = set()
    for work in _workloads(built):
        name = work["metadata"]["name"]
        names.add(name)
        pod = work["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True, name
        assert pod["securityContext"]["runAsUser"] == 10001, name
        assert pod["automountServiceAccountToken"] is False, name
        for container in pod.get("initContainers", []) + pod["containers"]:
            sc = container["securityContext"]
            assert sc["allowPrivilegeEscalation"] is False, name
            assert sc["readOnlyRootFilesystem"] is True, name
            assert sc["capabilities"]["drop"] == ["ALL"], name
            assert set(container["resources"]) == {"requests", "limits"}, name
        # the one root container: the agent's init, chown of its spool only
        for init in pod.get("initContainers", []):
            assert (name, init["securityContext"]["capabilities"]["add"]) == (
                "mycroft-agent",
                ["CHOWN"],
            )
        for container in pod["containers"]:
            _check_container(name, pod, container)
    if layout == "single-stage":
        assert names == {"mycroft-agent", "mycroft-streams", "mycroft-sinks"}
    else:
        stages = {f"mycroft-streams-{s}" for s in ("split", "comm", "job")}
        assert names == {"mycroft-agent", "mycroft-sinks", *stages}


def _check_container(name: str, pod: dict[str, Any], container: dict[str, Any]) -> None:
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    args = container["args"]
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        get = container[probe]["httpGet"]
        assert get["path"] == "/metrics" and get["port"] in ports, (name, probe)
    # the metrics port the probes hit is the one the command serves
    served = (
        _flag(args, "--metrics-port")
        or (_flag(args, "--prometheus-listen") or "").rpartition(":")[2]
    )
    assert served == str(ports["metrics"]), name
    # kubelet probes the pod's IP: the listener must not be loopback only
    address = (
        _flag(args, "--metrics-address")
        or _flag(args, "--metrics-addr")
        or (_flag(args, "--prometheus-listen") or "").rpartition(":")[0]
    )
    assert address == "0.0.0.0", name
    # Kafka security comes from the role's Secret, mounted where the flag points
    security = _flag(args, "--kafka-security-file")
    assert security is not None, name
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    (volume,) = [v for v, path in mounts.items() if security.startswith(path + "/")]
    assert volumes[volume]["secret"]["secretName"].startswith("mycroft-kafka-"), name
    env = {e["name"]: e.get("value") for e in container.get("env", [])}
    assert env["MYCROFT_CONFIG"] == mounts["config"], name


def test_workers_fit_the_partitions_and_stages_agree(two_stage_tree: Path) -> None:
    config = next(o for o in _objects(kustomize_build(K8S)) if o["kind"] == "ConfigMap")
    partitions = tomllib.loads(config["data"]["mycroft.toml"])["streams"]["partitions"]
    groups = {}
    for layout in (K8S, two_stage_tree):
        for work in _workloads(kustomize_build(layout)):
            if work["metadata"]["name"].startswith("mycroft-streams"):
                assert work["spec"]["replicas"] <= partitions
                args = work["spec"]["template"]["spec"]["containers"][0]["args"]
                stage = _flag(args, "--stage")
                if stage in ("split", "comm"):
                    groups[stage] = _flag(args, "--comm-groups")
    assert groups["split"] == groups["comm"] is not None


def doc_block(language: str) -> str:
    """The first ``language`` code block of docs/deploy.md."""
    text = (ROOT / "docs" / "deploy.md").read_text()
    start = text.index(f"```{language}\n") + len(language) + 4
    return text[start : text.index("```", start)]


def test_the_training_pod_snippet_is_valid(schema_dir: Path) -> None:
    """docs/deploy.md's training pod fragment, as the spec of a Pod."""
    spec = yaml.safe_load(doc_block("yaml"))
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "trainer"}}
    done = kubeconform(schema_dir, yaml.safe_dump(pod | {"spec": spec}))
    assert done.returncode == 0, done.stdout + done.stderr
    # the agent reads the same hostPath
    agent = next(
        w for w in _workloads(kustomize_build(K8S)) if w["kind"] == "DaemonSet"
    )
    host_paths = {
        v["hostPath"]["path"]
        for v in agent["spec"]["template"]["spec"]["volumes"]
        if "hostPath" in v
    }
    assert spec["volumes"][0]["hostPath"]["path"] in host_paths


# -- the Containerfile ----------------------------------------------------------------


def test_the_training_image_snippet_lints_clean(tmp_path: Path) -> None:
    """docs/deploy.md's training image: hadolint, and the plugin's real path."""
    snippet = doc_block("dockerfile")
    path = tmp_path / "Containerfile"
    path.write_text(snippet)
    done = _run([_tool("hadolint"), "--no-color", str(path)])
    assert done.returncode == 0, done.stdout + done.stderr
    assert "/opt/mycroft/nccl/libnccl-profiler-mycroft.so" in snippet


def test_hadolint_passes_the_containerfile() -> None:
    done = _run([_tool("hadolint"), "--no-color", str(CONTAINERFILE)])
    assert done.returncode == 0, done.stdout + done.stderr


def test_hadolint_is_not_vacuous(tmp_path: Path) -> None:
    bad = tmp_path / "Containerfile"
    bad.write_text("FROM python:latest\nRUN pip install mycroft-trace\n")
    done = _run([_tool("hadolint"), "--no-color", str(bad)])
    assert done.returncode != 0
    assert "DL3007" in done.stdout and "DL3013" in done.stdout


def runtime_stage() -> list[tuple[str, str]]:
    """The last stage's instructions as (INSTRUCTION, arguments), lines joined."""
    text = re.sub(r"\\\n\s*", " ", CONTAINERFILE.read_text())
    lines = [ln.strip() for ln in text.splitlines()]
    lines = [ln for ln in lines if ln and not ln.startswith("#")]
    last_from = max(i for i, ln in enumerate(lines) if ln.startswith("FROM "))
    return [(ln.split(None, 1)[0], ln.split(None, 1)[1]) for ln in lines[last_from:]]


def test_the_image_runs_mycroft_as_a_non_root_user() -> None:
    stage = runtime_stage()
    text = CONTAINERFILE.read_text()
    assert len(re.findall(r"^FROM ", text, re.M)) == 2  # build, then runtime
    (user,) = [a for i, a in stage if i == "USER"]
    assert user == "10001:10001"  # the manifests' runAsUser
    (entry,) = [a for i, a in stage if i == "ENTRYPOINT"]
    assert json.loads(entry) == ["mycroft"]
    (expose,) = [a for i, a in stage if i == "EXPOSE"]
    manifest_ports = {
        str(p["containerPort"])
        for w in _workloads(kustomize_build(K8S))
        for c in w["spec"]["template"]["spec"]["containers"]
        for p in c["ports"]
    }
    assert set(expose.split()) == manifest_ports
    # the plugin where `mycroft nccl-plugin path` and docs/deploy.md say it is
    env = " ".join(a for i, a in stage if i == "ENV")
    assert "MYCROFT_NCCL_BUILD=/opt/mycroft/nccl" in env
    assert any(
        i == "COPY" and a.endswith("libnccl-profiler-mycroft.so /opt/mycroft/nccl/")
        for i, a in stage
    )
    deploy = (ROOT / "docs" / "deploy.md").read_text()
    assert "/opt/mycroft/nccl/libnccl-profiler-mycroft.so" in deploy
    # one version: the package's, the wheel the image installs, the manifests' tag
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert ("ARG", f"VERSION={version}") in stage
    images = {
        c["image"]
        for w in _workloads(kustomize_build(K8S))
        for c in w["spec"]["template"]["spec"]["containers"]
    }
    assert images == {f"ghcr.io/mycroft/mycroft-trace:{version}"}


# -- systemd --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "unit",
    ["mycroft-agent.service", "mycroft-streams.service", "mycroft-sinks.service"],
)
def test_systemd_unit_verifies_clean(unit: str, tmp_path: Path) -> None:
    """systemd-analyze verify, with the unit's ExecStart pointed at a real
    ``mycroft`` (verify insists the binary exists); any warning fails."""
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        unavailable("systemd-analyze", "apt-get install systemd (./dev setup, as root)")
    text = (SYSTEMD / unit).read_text()
    assert "ExecStart=/usr/local/bin/mycroft " in text
    mycroft = shutil.which("mycroft") or str(ROOT / ".venv" / "bin" / "mycroft")
    copy = tmp_path / unit
    copy.write_text(text.replace("/usr/local/bin/mycroft", mycroft))
    done = _run([analyze, "verify", str(copy)])
    assert done.returncode == 0 and not (done.stdout + done.stderr).strip(), (
        done.stdout + done.stderr
    )


def test_systemd_verify_is_not_vacuous(tmp_path: Path) -> None:
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        unavailable("systemd-analyze", "apt-get install systemd (./dev setup, as root)")
    bad = tmp_path / "bad.service"
    bad.write_text("[Service]\nExecStart=/bin/true\nProtectSytem=strict\n")
    done = _run([analyze, "verify", str(bad)])
    assert "Unknown key" in done.stdout + done.stderr
