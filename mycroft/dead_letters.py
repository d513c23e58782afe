"""Dead letters that always fit on the dead-letter topic.

A bad record is dead-lettered with its bytes and, in headers, why
(``mycroft.dlq.reason``, ``mycroft.dlq.detail``), where it came from
(``mycroft.dlq.source``: ``topic[partition]@offset`` or ``job/host``) and its
size (``mycroft.dlq.size``). A record bigger than a producer may send (a
rejected 1,000,000-row state batch re-encodes to tens of MB; Faust's producer
and the broker stop at 1 MB by default) would make the send itself fail and
take the consuming agent down with it: its bytes are cut to
:data:`MAX_BYTES`, and ``mycroft.dlq.truncated`` says so.
"""

from __future__ import annotations

from collections.abc import Sequence

REASON, DETAIL, SOURCE = (
    "mycroft.dlq.reason",
    "mycroft.dlq.detail",
    "mycroft.dlq.source",
)
SIZE = "mycroft.dlq.size"
"""Header: the size in bytes of the record as it was, before any cut."""
TRUNCATED = "mycroft.dlq.truncated"
"""Header, only on a cut record: ``1``."""

MAX_BYTES = 900_000
"""Value, key and headers of one dead letter at most: under the 1 MB that
Faust's producer (``producer_max_request_size``) and the broker
(``message.max.bytes``) accept by default, with room for the record's
framing."""
MAX_DETAIL_BYTES = 4096
"""A reason's detail at most (it may quote a whole record)."""

Headers = list[tuple[str, bytes]]


def headers_of(reason: str, detail: str, source: str) -> Headers:
    """The headers of a dead letter before :func:`fit`."""
    text = detail.encode("utf-8", "replace")
    if len(text) > MAX_DETAIL_BYTES:
        text = text[: MAX_DETAIL_BYTES - 3] + b"..."
    return [(REASON, reason.encode()), (DETAIL, text), (SOURCE, source.encode())]


def fit(
    value: bytes | None,
    key: bytes | None,
    headers: Sequence[tuple[str, bytes]],
    max_bytes: int = MAX_BYTES,
) -> tuple[bytes, Headers]:
    """``value`` cut to what fits in ``max_bytes`` with ``key`` and
    ``headers``, and the headers with its size (and the cut, if any) added.

    Args:
        value: the bad record's bytes (None: a null value).
        key: its key, sent as is.
        headers: :func:`headers_of`.
        max_bytes: value, key and headers at most.

    Returns:
        The bytes to send and the headers to send them with.
    """
    data = value or b""
    out: Headers = [*headers, (SIZE, str(len(data)).encode())]
    used = len(key or b"") + sum(len(k) + len(v) for k, v in out)
    room = max(0, max_bytes - used - len(TRUNCATED) - 1)
    if len(data) > room:
        data = data[:room]
        out.append((TRUNCATED, b"1"))
    return data, out
