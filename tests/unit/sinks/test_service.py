"""Forwarder: write to every sink, flush, then commit; retry and drop rules."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException
from prometheus_client import CollectorRegistry

from mycroft.errors import ConfigError, SinkError
from mycroft.schemas.records import Heartbeat
from mycroft.sinks.memory import MemorySink
from mycroft.sinks.prometheus import PrometheusSink
from mycroft.sinks.service import Backoff, Forwarder, load_settings, main
from tests.unit.samples import all_records, header
from tests.unit.sinks.records import anomaly, root_cause


class Source:
    def __init__(self, *batches: list[Any]) -> None:
        self.batches = list(batches)

    def poll(self, timeout_s: float = 1.0, max_records: int = 500) -> list[Any]:
        return [(None, r) for r in self.batches.pop(0)] if self.batches else []

    def close(self) -> None:
        pass


class Flaky(MemorySink):
    """Fails the next ``failures`` flushes with ``retryable``."""

    def __init__(self, failures: int, retryable: bool = True) -> None:
        super().__init__()
        self.failures = failures
        self.retryable = retryable

    def flush(self) -> None:
        if self.failures:
            self.failures -= 1
            raise SinkError("down", retryable=self.retryable)
        super().flush()


def make(
    source: Source, *sinks: MemorySink, attempts: int = 3
) -> tuple[Forwarder, list[int], list[float]]:
    commits: list[int] = []
    sleeps: list[float] = []

    def commit() -> None:
        commits.append(sum(len(s.flushed) for s in sinks))

    def sleep(s: float) -> bool:
        sleeps.append(s)
        return False

    fw = Forwarder(
        source, list(sinks), commit, backoff=Backoff(0.1, 0.3, attempts), sleep=sleep
    )
    return fw, commits, sleeps


def test_commit_after_every_sink_flushed() -> None:
    a, b = MemorySink(), MemorySink()
    fw, commits, _ = make(Source([anomaly(), root_cause()]), a, b)
    assert fw.step() == 2
    assert commits == [4]  # both records flushed to both sinks before the commit
    assert fw.step() == 0 and commits == [4]  # empty poll: no commit
    assert a.incidents.keys() == {"i-1"} and a.anomalies.keys() == {"a-1"}


def test_a_failed_commit_is_retried_with_the_next_batch_not_fatal() -> None:
    """Kafka gone between the poll and the commit: the service keeps running
    and the next batch's commit covers both batches."""
    sink = MemorySink()
    calls: list[int] = []

    def commit() -> None:
        calls.append(len(sink.flushed))
        if len(calls) == 1:
            raise KafkaException(KafkaError(KafkaError._TRANSPORT))

    fw = Forwarder(Source([anomaly()], [root_cause()]), [sink], commit)
    assert fw.step() == 1 and fw.stats.commit_failures == 1 and fw.stats.commits == 0
    assert fw.step() == 1 and fw.stats.commits == 1
    assert calls == [1, 2]


def test_other_records_are_skipped() -> None:
    sink = MemorySink()
    fw, commits, _ = make(Source([header(), anomaly()]), sink)  # type: ignore[list-item]
    fw.step()
    assert fw.stats.skipped == 1 and len(sink.flushed) == 1 and commits


def test_heartbeats_keep_the_job_alive_in_job_watchers() -> None:
    registry = CollectorRegistry()
    prom, memory = PrometheusSink(registry), MemorySink()
    beat = next(r for r in all_records() if isinstance(r, Heartbeat))
    fw, commits, _ = make(Source([beat, beat]), memory)
    fw.sinks.append(prom)
    fw.step()
    assert fw.stats.heartbeats == 2 and fw.stats.skipped == 0 and commits
    assert prom.active_jobs == frozenset({beat.job_id}) and not memory.flushed


def test_retryable_flush_is_retried_with_backoff() -> None:
    sink = Flaky(2)
    fw, commits, sleeps = make(Source([anomaly()]), sink)
    fw.step()
    assert sleeps == [0.1, 0.2] and fw.stats.retries == 2 and commits == [1]


def test_retries_exhausted_raise_without_commit() -> None:
    sink = Flaky(5)
    fw, commits, sleeps = make(Source([anomaly()]), sink, attempts=3)
    with pytest.raises(SinkError):
        fw.step()
    assert commits == [] and sleeps == [0.1, 0.2]


def test_non_retryable_is_dropped_and_committed() -> None:
    sink = Flaky(1, retryable=False)
    fw, commits, sleeps = make(Source([anomaly()]), sink)
    fw.step()
    assert fw.stats.dropped == 1 and sleeps == [] and len(commits) == 1


def test_backoff_is_capped() -> None:
    assert Backoff(0.2, 1.0, 6).delays() == [0.2, 0.4, 0.8, 1.0, 1.0]


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--opensearch-url", "http://x:1"], "give --bootstrap"),
        (["--bootstrap", "127.0.0.1:1"], "give --prometheus-listen and/or"),
        (["--bootstrap", "h:1", "--prometheus-listen", "nope"], "HOST:PORT"),
    ],
)
def test_main_rejects_bad_config(
    argv: list[str], says: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Flags that do not combine are a usage error of the mycroft command
    (``cli_errors`` turns the ConfigError into exit code 2)."""
    monkeypatch.delenv("MYCROFT_BOOTSTRAP", raising=False)
    with pytest.raises(ConfigError, match=says):
        main(argv)


def test_lag_groups_from_flags_env_or_default() -> None:
    assert load_settings([], {}).lag_group == ("mycroft-streams",)
    env = {"MYCROFT_SINKS__LAG_GROUPS": "a, b,"}
    assert load_settings([], env).lag_group == ("a", "b")
    argv = ["--lag-group", "x", "--lag-group", "y"]
    assert load_settings(argv, env).lag_group == ("x", "y")
    assert load_settings(["--lag-group", ""], {}).lag_group == ()


def test_settings_flag_over_env_over_file(tmp_path: Path) -> None:
    path = tmp_path / "mycroft.toml"
    path.write_text('[sinks]\nretries = 3\ngroup = "file"\nincident_ttl = 5\n')
    env = {"MYCROFT_CONFIG": str(path), "MYCROFT_SINKS__GROUP": "env"}
    s = load_settings(["--incident-ttl", "7"], env)
    assert (s.retries, s.group, s.incident_ttl) == (3, "env", 7.0)
    env["MYCROFT_SINKS__INCIDENT_TTL_S"] = "9"  # the older name still works
    assert load_settings([], env).incident_ttl == 9.0


@pytest.mark.parametrize(
    ("argv", "env", "says"),
    [
        (["--retries", "many"], {}, "--retries='many': retries must be an integer"),
        ([], {"MYCROFT_SINKS__JOB_END_S": "x"}, "MYCROFT_SINKS__JOB_END_S='x'"),
        (["--job-end", "0"], {}, "--job-end must be > 0"),
    ],
)
def test_bad_settings_name_their_source(
    argv: list[str], env: dict[str, str], says: str
) -> None:
    with pytest.raises(ConfigError, match=re.escape(says)):
        load_settings(argv, env)
