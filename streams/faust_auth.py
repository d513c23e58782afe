"""Faust (aiokafka) authentication of the stream worker from :class:`KafkaSecurity`.

The worker's confluent-kafka clients (topic creation) take
``KafkaSecurity.librdkafka()``; its Faust app takes the credentials built here:
SASL user and password with a TLS context that checks the broker's
certificate against the configured CA.
"""

from __future__ import annotations

from typing import Any

import faust

from mycroft.kafka_security import KafkaSecurity


def faust_auth(security: KafkaSecurity) -> dict[str, Any]:
    """Keyword arguments of ``faust.App`` for ``security``; none for PLAINTEXT."""
    if security.protocol == "PLAINTEXT":
        return {}
    context = security.ssl_context()
    if not security.sasl:
        return {"broker_credentials": faust.SSLCredentials(context)}
    credentials = faust.SASLCredentials(
        username=security.username,
        password=security.password.reveal(),
        ssl_context=context,
        mechanism=security.mechanism,
    )
    return {"broker_credentials": credentials}
