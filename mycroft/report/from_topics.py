"""An incident's report from Kafka: ``mycroft incidents show ID --report DIR``.

The root cause and the anomalies it cites come from the incident book; the
job's raw records (state, completion, topology) are read back from the raw
topics, which keep them for their retention (a day by default), with the
same reader as the incidents (partitions assigned, no group, nothing
committed).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from mycroft import report
from mycroft.report.collect import Collector
from mycroft.schemas.records import CompletionBatch, Record, StateBatch

if TYPE_CHECKING:
    from mycroft.incident_book import Incident, IncidentBook
    from mycroft.incidents import Source


def read_raw(source: Source, collector: Collector) -> int:
    """Feed the raw topics' records to ``collector``; return how many batches
    of its job it took.

    Raises:
        BrokerError: the topics were not read to their end within the timeout.
    """
    from mycroft.incidents import catch_up  # noqa: PLC0415

    topics = source.topics
    reader = source.reader([topics.topology, topics.state, topics.completion])
    taken = 0

    def take(record: Record) -> None:
        nonlocal taken
        collector.add(record)
        if isinstance(record, StateBatch | CompletionBatch):
            taken += record.header.job_id == collector.rc.job_id

    try:
        catch_up(source, reader, take)
    finally:
        reader.close()
    return taken


def write_from_topics(
    source: Source,
    book: IncidentBook,
    incident: Incident,
    out_dir: str | Path,
    err: TextIO | None = None,
) -> Path:
    """Write the incident's report into ``out_dir``; return the page."""
    cited = book.cited(incident)
    collector = Collector(incident.latest, cited)
    if read_raw(source, collector) == 0:
        print(
            f"note: no raw records of job {incident.latest.job_id} on "
            f"{source.topics.state}: past the topics' retention, or another "
            "--topic-prefix; the progress and flow figures are empty",
            file=err or sys.stderr,
        )
    return report.write(out_dir, [collector.result()], cited)
