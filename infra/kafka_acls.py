"""Who may do what on a secured broker: the ACLs of each Mycroft role.

Pure: :func:`role_acls` returns confluent-kafka ``AclBinding`` values and
:func:`apply_acls` creates them with an admin client. The broker runs KRaft's
``StandardAuthorizer`` with ``allow.everyone.if.no.acl.found=false``, so what
is not granted here is refused.

=========== ==============================================================
role        allowed
=========== ==============================================================
agent       Write, Describe on the four raw topics; nothing else
worker      Read raw; Write detect/rca/dlq; Read+Write the two-stage
            topics; everything on topics and groups starting with its app id
            (Faust's tick, changelog, repartition and leader topics)
sinks       Read anomaly, root cause and heartbeat with its group; Write dlq;
            Describe the raw topics and the workers' groups (lag metrics)
subscriber  Read the root-cause topic with groups starting with its group
=========== ==============================================================
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

# where they are defined: confluent_kafka.admin re-exports them implicitly only
from confluent_kafka.admin._acl import AclBinding, AclOperation, AclPermissionType
from confluent_kafka.admin._resource import ResourcePatternType, ResourceType

from mycroft.errors import BrokerError, ConfigError
from mycroft.topics import TopicSet

ROLES = ("agent", "worker", "sinks", "subscriber")

_OP = AclOperation
_LITERAL = ResourcePatternType.LITERAL
_PREFIXED = ResourcePatternType.PREFIXED


@dataclass(frozen=True)
class Grant:
    """One user's role and the names it applies to.

    Attributes:
        username: SASL user; the principal is ``User:<username>``.
        role: one of :data:`ROLES`.
        group: consumer group (sinks), group prefix (subscriber) or app id
            (worker: its group and the prefix of Faust's internal topics).
        watched_groups: groups whose lag the sinks may read (workers' app ids).
    """

    username: str
    role: str
    group: str = ""
    watched_groups: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise ConfigError(f"role {self.role!r} is not one of {', '.join(ROLES)}")
        if self.role != "agent" and not self.group:
            raise ConfigError(f"role {self.role} needs a group")


def _allow(
    kind: ResourceType,
    name: str,
    pattern: ResourcePatternType,
    user: str,
    ops: Iterable[AclOperation],
) -> list[AclBinding]:
    return [
        AclBinding(
            kind, name, pattern, f"User:{user}", "*", op, AclPermissionType.ALLOW
        )
        for op in ops
    ]


def _topics(
    names: Sequence[str], user: str, ops: Iterable[AclOperation]
) -> list[AclBinding]:
    ops = tuple(ops)
    return [
        b for n in names for b in _allow(ResourceType.TOPIC, n, _LITERAL, user, ops)
    ]


def role_acls(grant: Grant, topics: TopicSet) -> list[AclBinding]:
    """The ALLOW bindings of ``grant`` on the topics of ``topics``, each once."""
    return list(dict.fromkeys(_role_acls(grant, topics)))


def _role_acls(grant: Grant, topics: TopicSet) -> list[AclBinding]:
    user = grant.username
    raw = [topics.topology, topics.state, topics.completion, topics.heartbeat]
    read, write = (_OP.READ, _OP.DESCRIBE), (_OP.WRITE, _OP.DESCRIBE)
    if grant.role == "agent":
        return _topics(raw, user, write)
    if grant.role == "subscriber":
        return _topics([topics.rootcause], user, read) + _allow(
            ResourceType.GROUP, grant.group, _PREFIXED, user, [_OP.READ]
        )
    if grant.role == "sinks":
        out = _topics([topics.anomaly, topics.rootcause, topics.heartbeat], user, read)
        out += _topics([topics.deadletter], user, write)
        out += _topics(raw, user, [_OP.DESCRIBE])
        out += _allow(ResourceType.GROUP, grant.group, _LITERAL, user, [_OP.READ])
        for watched in grant.watched_groups:
            group = ResourceType.GROUP
            out += _allow(group, watched, _LITERAL, user, [_OP.DESCRIBE])
        return out
    out = _topics(raw, user, read)
    out += _topics([topics.anomaly, topics.rootcause, topics.deadletter], user, write)
    out += _topics([topics.split_state, topics.comm_summary], user, (*read, _OP.WRITE))
    out += _allow(ResourceType.TOPIC, grant.group, _PREFIXED, user, [_OP.ALL])
    out += _allow(ResourceType.GROUP, grant.group, _PREFIXED, user, [_OP.ALL])
    return out


def apply_acls(
    admin: AdminClient, bindings: list[AclBinding], timeout_s: float
) -> None:
    """Create ``bindings`` (idempotent: an existing binding is kept).

    Raises:
        BrokerError: the broker refused one.
    """
    if not bindings:
        return
    for binding, future in admin.create_acls(bindings).items():
        try:
            future.result(timeout=timeout_s)
        except KafkaException as exc:
            raise BrokerError(f"cannot create ACL {binding}: {exc}") from exc
