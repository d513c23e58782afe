"""Topic declarations and job partitioning."""

from __future__ import annotations

import re
from pathlib import Path

from mycroft.schemas.codec import SCHEMA_FILES
from mycroft.topics import TOPICS, TopicSet, partition_for


def test_names_follow_the_scheme() -> None:
    for spec in TOPICS:
        assert re.fullmatch(r"mycroft\.[a-z]+\.[a-z]+\.v\d+", spec.name), spec.name


def test_every_record_type_has_exactly_one_topic() -> None:
    records = [s.record for s in TOPICS if s.record != "-"]
    assert sorted(records) == sorted(SCHEMA_FILES)


def test_topology_is_compacted_and_raw_data_is_not() -> None:
    cfg = {s.name: s.config() for s in TOPICS}
    assert cfg["mycroft.raw.topology.v1"]["cleanup.policy"] == "compact"
    assert "cleanup.policy" not in cfg["mycroft.raw.state.v1"]


def test_prefix_and_partition_override() -> None:
    topics = TopicSet("t1-", partitions=2)
    assert topics.state == "t1-mycroft.raw.state.v1"
    assert topics.for_record("RootCause") == "t1-mycroft.rca.rootcause.v1"
    assert topics.partitions("raw.state") == 2


def test_partition_is_stable_per_job_and_spreads_jobs() -> None:
    assert partition_for("job-a", 8) == partition_for("job-a", 8)
    used = {partition_for(f"job-{i}", 8) for i in range(200)}
    assert used == set(range(8))


def test_readme_topic_table_lists_every_topic_with_its_key() -> None:
    readme = (Path(__file__).parents[2] / "README.md").read_text()
    table = readme.split("## Topics", 1)[1].split("\n\n", 2)[1]
    rows = {
        cells[0].strip("` "): cells[2].strip("` ")
        for line in table.splitlines()[2:]
        if (cells := [c.strip() for c in line.strip("|").split("|")])
    }
    assert rows == {spec.name: spec.key for spec in TOPICS}
