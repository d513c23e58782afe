"""``mycroft replay FILE --kafka BOOTSTRAP``: publish a recorded trace file to Kafka.

Values are sent byte for byte (their dedup keys unchanged), partitioned by
job. ``--speed 1`` keeps the recorded pacing; the default sends at once. For
a durable, resumable replay use ``mycroft agent --source replay``.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from mycroft.errors import ConfigError
from mycroft.kafka_client import RecordPublisher, create_topics
from mycroft.producers.tracefile import read_frames
from mycroft.topics import TopicSet

log = logging.getLogger(__name__)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="mycroft replay", description=__doc__)
    p.add_argument("file", type=Path, help="trace file (.myc or .myc.gz)")
    p.add_argument("--kafka", required=True, help="bootstrap servers")
    p.add_argument("--topic-prefix", default="", help="topic name prefix")
    p.add_argument(
        "--partitions", type=int, default=0, help="override partition counts"
    )
    p.add_argument(
        "--speed", type=float, default=0.0, help="1.0 = recorded pace; 0 = at once"
    )
    p.add_argument("--create-topics", action="store_true", help="create missing topics")
    p.add_argument("--kafka-option", action="append", default=[], metavar="KEY=VALUE")
    return p


def replay(path: Path, publisher: RecordPublisher, speed: float = 0.0) -> int:
    """Publish every frame of ``path``; return how many were queued."""
    t0_trace: int | None = None
    t0 = time.monotonic()
    n = 0
    for frame in read_frames(path):
        if speed > 0:
            t0_trace = frame.ts_ns if t0_trace is None else t0_trace
            wait = (frame.ts_ns - t0_trace) / 1e9 / speed - (time.monotonic() - t0)
            if wait > 0:
                time.sleep(wait)
        topic = publisher.topics.for_record(frame.record_type)
        publisher.publish_bytes(topic, frame.key.split("/")[0], frame.key, frame.value)
        publisher.poll(0)
        n += 1
    return n


def main(argv: Sequence[str] | None = None) -> int:
    """Replay one file; exit 1 if any delivery failed, 2 on bad arguments."""
    args = _parser().parse_args(sys.argv[1:] if argv is None else list(argv))
    logging.basicConfig(
        level=logging.INFO, format="%(levelname)s %(name)s: %(message)s"
    )
    extra = dict(opt.partition("=")[::2] for opt in args.kafka_option)
    topics = TopicSet(args.topic_prefix, args.partitions or None)
    try:
        if args.create_topics:
            create_topics(args.kafka, topics, extra=extra)
        publisher = RecordPublisher(args.kafka, topics, extra=extra)
        n = replay(args.file, publisher, args.speed)
    except ConfigError as exc:
        print(f"mycroft replay: {exc}", file=sys.stderr)
        return 2
    left = publisher.flush(60.0)
    st = publisher.stats
    log.info(
        "replayed %d records: %d delivered, %d failed, %d unconfirmed",
        n,
        st.delivered,
        st.failed,
        left,
    )
    return 0 if st.failed == 0 and left == 0 else 1
