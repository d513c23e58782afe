"""A secured single-node broker: SASL_SSL, SCRAM-SHA-512 users, ACLs.

:class:`SecureKafkaBroker` is a :class:`~mycroft.infra.kafka_broker.KafkaBroker`
whose client listener is ``SASL_SSL`` (TLS with a certificate made by
:func:`make_tls`, signed by a CA made at the same time), whose users are
SCRAM-SHA-512 credentials written into the KRaft metadata at format time, and
whose authorizer is KRaft's ``StandardAuthorizer``: nothing is allowed unless
an ACL of :mod:`mycroft.infra.kafka_acls` grants it. The ``admin`` user is the
super user that creates topics and ACLs. ``infra/SECURITY.md`` walks through it.

The KRaft controller listener stays PLAINTEXT on 127.0.0.1: the broker talks
to its own controller there as ``User:ANONYMOUS``, which must therefore be a
super user. Only a process on the same host can reach that port.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from confluent_kafka.admin import AdminClient

from mycroft.errors import BrokerError, ConfigError
from mycroft.infra import _kafka_props as kp
from mycroft.infra.kafka_acls import Grant, apply_acls, role_acls
from mycroft.infra.kafka_broker import KafkaBroker
from mycroft.kafka_logging import client_logger
from mycroft.kafka_security import KafkaSecurity, Secret
from mycroft.topics import TopicSet

__all__ = ["SecureKafkaBroker", "TlsFiles", "User", "make_tls"]

logger = logging.getLogger(__name__)

ADMIN = "admin"
MECHANISM = "SCRAM-SHA-512"
LISTENER = "SASL_SSL"
_SCRAM_LOGIN = "org.apache.kafka.common.security.scram.ScramLoginModule"
_AUTHORIZER = "org.apache.kafka.metadata.authorizer.StandardAuthorizer"


@dataclass(frozen=True)
class TlsFiles:
    """What :func:`make_tls` wrote.

    Attributes:
        ca_file: the CA certificate (PEM) clients check the broker against.
        keystore: the broker's key and certificate chain (PKCS#12).
        keystore_password: password of ``keystore``.
    """

    ca_file: Path
    keystore: Path
    keystore_password: Secret


def _openssl(args: Sequence[str], cwd: Path) -> None:
    openssl = kp.require_tool("openssl")
    done = subprocess.run(
        [openssl, *args], cwd=cwd, capture_output=True, timeout=60, check=False,
        stdin=subprocess.DEVNULL,
    )  # fmt: skip
    if done.returncode != 0:
        err = done.stderr.decode("utf-8", "replace")[-2000:]
        raise BrokerError(f"openssl {args[0]} failed ({done.returncode}): {err}")


def make_tls(directory: Path, host: str = kp.HOST, days: int = 7) -> TlsFiles:
    """Make a CA and a broker certificate for ``host`` it signed, with openssl.

    The certificate names ``host`` as an IP (or DNS) subject alternative name
    and ``localhost``, so clients that verify host names accept it. Keys are
    EC P-256 (fast to make); the files are readable by their owner only.

    Raises:
        BrokerError: openssl is missing or failed.
    """
    directory.mkdir(parents=True, exist_ok=True)
    os.chmod(directory, 0o700)
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    _openssl(
        ["req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.pem",
         "-days", str(days), "-subj", "/CN=Mycroft test CA"],
        directory,
    )  # fmt: skip
    _openssl(
        ["req", *ec, "-keyout", "broker.key", "-out", "broker.csr",
         "-subj", f"/CN={host}"],
        directory,
    )  # fmt: skip
    kind = "IP" if host.replace(".", "").isdigit() or ":" in host else "DNS"
    (directory / "san.cnf").write_text(
        f"subjectAltName=DNS:localhost,{kind}:{host}\n", "utf-8"
    )
    _openssl(
        ["x509", "-req", "-in", "broker.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
         "-CAcreateserial", "-out", "broker.pem", "-days", str(days),
         "-extfile", "san.cnf"],
        directory,
    )  # fmt: skip
    password = Secret(secrets.token_urlsafe(18))
    env_var = "MYCROFT_KEYSTORE_PASSWORD"
    os.environ[env_var] = password.reveal()
    try:
        _openssl(
            ["pkcs12", "-export", "-in", "broker.pem", "-inkey", "broker.key",
             "-certfile", "ca.pem", "-name", "broker", "-out", "broker.p12",
             "-passout", f"env:{env_var}"],
            directory,
        )  # fmt: skip
    finally:
        del os.environ[env_var]
    for path in directory.iterdir():
        path.chmod(0o600)
    return TlsFiles(directory / "ca.pem", directory / "broker.p12", password)


@dataclass(frozen=True)
class User:
    """A SCRAM user of the secured broker and the role its ACLs give it.

    Attributes:
        grant: user name, role and group (see :class:`~kafka_acls.Grant`).
        password: its password; a random one unless given.
    """

    grant: Grant
    password: Secret

    @classmethod
    def of(cls, username: str, role: str, group: str = "", **kw: object) -> User:
        """A user with a random password."""
        grant = Grant(username, role, group, **kw)  # type: ignore[arg-type]  # Grant validates
        return cls(grant, Secret(secrets.token_urlsafe(18)))


class SecureKafkaBroker(KafkaBroker):
    """A :class:`KafkaBroker` with a SASL_SSL listener, SCRAM users and ACLs.

    Args:
        users: the users besides ``admin`` (super user), each with its ACLs.
        topics: the topic names the ACLs are written for.
        workdir, heap_mb, cache_dir, keep: as :class:`KafkaBroker`.

    After :meth:`start`, :meth:`client` gives each user's client settings.
    """

    def __init__(
        self,
        users: Sequence[User],
        topics: TopicSet | None = None,
        workdir: Path | None = None,
        **kw: object,
    ) -> None:
        super().__init__(workdir, **kw)  # type: ignore[arg-type]  # KafkaBroker's keywords
        names = [u.grant.username for u in users]
        if ADMIN in names or len(set(names)) != len(names):
            raise ConfigError(f"user names must be unique and not {ADMIN!r}: {names}")
        self.users = {u.grant.username: u for u in users}
        self.topics = topics or TopicSet()
        self.admin_password = Secret(secrets.token_urlsafe(18))
        self._tls: TlsFiles | None = None

    @property
    def ca_file(self) -> Path:
        """The CA certificate clients check the broker against."""
        if self._tls is None:
            raise BrokerError("the broker has no certificate yet; call start() first")
        return self._tls.ca_file

    def client(self, username: str = ADMIN) -> KafkaSecurity:
        """The client security settings of ``username`` (``admin``: super user).

        Raises:
            KeyError: no such user.
        """
        password = (
            self.admin_password if username == ADMIN else self.users[username].password
        )
        return KafkaSecurity(
            protocol=LISTENER, mechanism=MECHANISM, username=username,
            password=password, ca_file=str(self.ca_file),
        )  # fmt: skip

    def start(self, timeout_s: float = 120.0, *, detach: bool = False) -> str:
        """Start the broker, then create every user's ACLs (as ``admin``)."""
        bootstrap = super().start(timeout_s, detach=detach)
        config: dict[str, Any] = {
            "bootstrap.servers": bootstrap,
            "logger": client_logger(),
        }
        admin = AdminClient(config | self._client_config())
        bindings = [
            b for u in self.users.values() for b in role_acls(u.grant, self.topics)
        ]
        try:
            apply_acls(admin, bindings, timeout_s=30.0)
        except BrokerError:
            self.stop()  # a broker without its ACLs is of no use, even detached
            raise
        logger.info("created %d ACLs for %d users", len(bindings), len(self.users))
        return bootstrap

    def write_clients(self, directory: Path) -> dict[str, Path]:
        """Write a security file per user (``<user>.json``, mode 0600) for
        ``--kafka-security-file``; return their paths by user."""
        directory.mkdir(parents=True, exist_ok=True)
        out = {}
        for name in [ADMIN, *self.users]:
            sec = self.client(name)
            path = directory / f"{name}.json"
            path.touch(0o600)
            path.chmod(0o600)
            values = {
                "security_protocol": sec.protocol, "sasl_mechanism": sec.mechanism,
                "sasl_username": sec.username, "sasl_password": sec.password.reveal(),
                "ssl_ca_file": sec.ca_file,
            }  # fmt: skip
            path.write_text(json.dumps(values, indent=2) + "\n", "utf-8")
            out[name] = path
        return out

    # --- KafkaBroker hooks ---------------------------------------------------

    def _server_properties(
        self, ports: kp.BrokerPorts, data_dir: Path
    ) -> dict[str, str]:
        if self._tls is None:
            self._tls = make_tls(self._workdir / "tls")
        tls = self._tls
        listeners = (
            f"{LISTENER}://{kp.HOST}:{ports.client},"
            f"CONTROLLER://{kp.HOST}:{ports.controller}"
        )
        jaas = (
            f'{_SCRAM_LOGIN} required username="{ADMIN}" '
            f'password="{self.admin_password.reveal()}";'
        )
        props = super()._server_properties(ports, data_dir)
        protocol_map = f"{LISTENER}:{LISTENER}"
        listener_prefix = f"listener.name.{LISTENER.lower()}"
        return props | {
            "listeners": listeners,
            "advertised.listeners": listeners,
            "inter.broker.listener.name": LISTENER,
            "listener.security.protocol.map": f"CONTROLLER:PLAINTEXT,{protocol_map}",
            "sasl.enabled.mechanisms": MECHANISM,
            "sasl.mechanism.inter.broker.protocol": MECHANISM,
            f"{listener_prefix}.{MECHANISM.lower()}.sasl.jaas.config": jaas,
            "ssl.keystore.type": "PKCS12",
            "ssl.keystore.location": str(tls.keystore),
            "ssl.keystore.password": tls.keystore_password.reveal(),
            "ssl.key.password": tls.keystore_password.reveal(),
            "ssl.truststore.type": "PEM",
            "ssl.truststore.location": str(tls.ca_file),
            "ssl.client.auth": "none",
            "authorizer.class.name": _AUTHORIZER,
            "super.users": f"User:{ADMIN};User:ANONYMOUS",
            "allow.everyone.if.no.acl.found": "false",
        }

    def _ports_from(self, props: dict[str, str]) -> kp.BrokerPorts:
        plain = props | {
            "listeners": props.get("listeners", "").replace(
                f"{LISTENER}://", "PLAINTEXT://"
            )
        }
        return kp.ports_from_properties(plain)

    def _format_args(self) -> list[str]:
        creds = [(ADMIN, self.admin_password)]
        creds += [(name, u.password) for name, u in self.users.items()]
        args = []
        for name, password in creds:
            value = f"{MECHANISM}=[name={name},password={password.reveal()}]"
            args += ["--add-scram", value]
        return args

    def _client_config(self) -> dict[str, Any]:
        return self.client(ADMIN).librdkafka()

    def _prepare(self, java: str, jars: Path) -> Path:
        config = super()._prepare(java, jars)
        config.chmod(0o600)  # it holds the keystore and inter-broker passwords
        return config


DEFAULT_USERS: tuple[tuple[str, str, str], ...] = (
    ("agent", "agent", ""),
    ("streams", "worker", "mycroft-streams"),
    ("sinks", "sinks", "mycroft-sinks"),
    ("subscriber", "subscriber", "mycroft-sub"),
)
"""``(user, role, group)`` of ``kafka_broker start --secure``: the default
app id of the worker, group of the sinks, and a subscriber group prefix."""


def cli_broker(
    directory: Path, prefix: str = "", heap_mb: int = 512
) -> SecureKafkaBroker:
    """The broker of ``python -m mycroft.infra.kafka_broker start --secure``.

    Its users are :data:`DEFAULT_USERS`; their security files are kept in
    ``<directory>/clients/`` (mode 0600), and a later start in the same folder
    reads the passwords back from them (the SCRAM credentials were written
    into the metadata when the storage was formatted).
    """
    saved: dict[str, Secret] = {}
    for path in sorted((directory / "clients").glob("*.json")):
        try:
            saved[path.stem] = Secret(
                json.loads(path.read_text("utf-8"))["sasl_password"]
            )
        except (OSError, ValueError, KeyError) as exc:
            raise ConfigError(f"cannot read the client file {path}: {exc}") from exc
    users = []
    for name, role, group in DEFAULT_USERS:
        watched = ("mycroft-streams",) if role == "sinks" else ()
        grant = Grant(name, role, group, watched)
        users.append(User(grant, saved.get(name) or Secret(secrets.token_urlsafe(18))))
    broker = SecureKafkaBroker(users, TopicSet(prefix), directory, heap_mb=heap_mb)
    if ADMIN in saved:
        broker.admin_password = saved[ADMIN]
    return broker
