"""Settings and wiring of the two-stage worker's stages (no broker)."""

from __future__ import annotations

import pytest

from mycroft.errors import ConfigError
from mycroft.schemas.records import CommSummary
from mycroft.streams.app import default_engine_factory
from mycroft.streams.core.comm_analyzer import CommAnalyzer
from mycroft.streams.core.engine import Analyzer
from mycroft.streams.core.job_resolver import JobResolver
from mycroft.streams.faust_runtime import record_job, record_time_ns
from mycroft.streams.faust_settings import StreamSettings, parse_settings
from mycroft.streams.faust_topics import changelog_topic, tick_topic
from mycroft.topics import TopicSet


def test_stage_flags_and_per_stage_consumer_groups() -> None:
    _, s = parse_settings(
        ["worker", "--bootstrap", "k:9092", "--stage", "comm", "--comm-groups", "4"],
        {},
    )
    assert (s.stage, s.comm_groups, s.group_id) == ("comm", 4, "mycroft-streams-comm")
    assert tick_topic(s) == "mycroft-streams-comm-tick"
    assert changelog_topic(s, "emitted") == "mycroft-streams-comm-emitted-changelog"
    single = StreamSettings("k:9092")
    assert single.group_id == "mycroft-streams" == tick_topic(single)[: -len("-tick")]


@pytest.mark.parametrize(
    ("env", "match"),
    [
        ({"MYCROFT_STREAMS__STAGE": "both"}, "stage must be one of"),
        ({"MYCROFT_STREAMS__COMM_GROUPS": "0"}, "comm groups must be"),
    ],
)
def test_bad_stage_settings_say_what_is_allowed(
    env: dict[str, str], match: str
) -> None:
    with pytest.raises(ConfigError, match=match):
        parse_settings(["worker", "--bootstrap", "k:9092"], env)


def test_each_stage_gets_its_engine() -> None:
    assert isinstance(default_engine_factory()("job"), Analyzer)
    comm = default_engine_factory("comm", 4)("job/a/2")
    assert isinstance(comm, CommAnalyzer)
    assert (comm.job_id, comm.group, comm.groups) == ("job/a", 2, 4)
    assert isinstance(default_engine_factory("job")("job"), JobResolver)


def test_summaries_route_by_job_on_their_tick() -> None:
    s = CommSummary("job-1", 1, 4, 123, 120, 7, 0)
    assert (record_job(s), record_time_ns(s)) == ("job-1", 123)
    t = TopicSet("p.", 2)
    assert t.split_state == "p.mycroft.split.commstate.v1"
    assert t.comm_summary == "p.mycroft.detect.commsummary.v1"
    assert t.for_record("CommSummary") == t.comm_summary
