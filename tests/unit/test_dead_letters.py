"""Dead letters are cut to fit the dead-letter topic, and say so."""

from __future__ import annotations

from mycroft import dead_letters as dl
from mycroft.errors import DecodeError
from mycroft.kafka_client import deadletter_headers


def test_a_small_record_goes_whole_with_its_size() -> None:
    headers = dl.headers_of("not-avro", "bad magic", "raw[0]@7")
    value, out = dl.fit(b"abc", b"job/h", headers)
    assert value == b"abc"
    assert dict(out) == {
        dl.REASON: b"not-avro", dl.DETAIL: b"bad magic", dl.SOURCE: b"raw[0]@7",
        dl.SIZE: b"3",
    }  # fmt: skip


def test_a_big_record_is_cut_to_fit_with_key_and_headers() -> None:
    big = bytes(36_000_000)
    headers = deadletter_headers(DecodeError("invalid", "x" * 100_000), "job/h1")
    value, out = dl.fit(big, b"job", headers)
    fields = dict(out)
    assert fields[dl.SIZE] == b"36000000" and fields[dl.TRUNCATED] == b"1"
    assert len(fields[dl.DETAIL]) == dl.MAX_DETAIL_BYTES
    total = len(value) + len(b"job") + sum(len(k) + len(v) for k, v in out)
    assert total <= dl.MAX_BYTES and value == big[: len(value)]


def test_a_null_value_is_an_empty_one() -> None:
    value, out = dl.fit(None, None, dl.headers_of("null-value", "", "raw[1]@0"))
    assert value == b"" and dict(out)[dl.SIZE] == b"0"
    assert dl.TRUNCATED not in dict(out)
