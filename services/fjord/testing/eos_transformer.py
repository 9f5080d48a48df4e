"""The seeds' shipping service as an exactly-once consume -> transform -> produce loop, for the
transactions chaos test: reads orders (``read_committed``, a consumer group), writes one
shipment per order and commits the input offsets in the same transaction.

Run as ``python -m fjord.testing.eos_transformer --bootstrap ... --transactional-id ...
--group ... --source ... --sink ...``. Exit codes: 0 after ``--idle-exit-s`` without input,
3 when fenced by a newer instance (a zombie), 1 on any other fatal error. Every commit is
printed (``committed N``) so the test can kill it mid-stream.
"""

from __future__ import annotations

import argparse
import sys
import time

from fjord.client import Consumer, Producer, TopicPartition
from fjord.errors import ErrorCode, TransactionError

FENCED_EXIT = 3


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--transactional-id", required=True)
    parser.add_argument("--group", required=True)
    parser.add_argument("--source", required=True)
    parser.add_argument("--sink", required=True)
    parser.add_argument("--batch", type=int, default=20)
    parser.add_argument("--idle-exit-s", type=float, default=3600.0)
    args = parser.parse_args(argv)
    consumer = Consumer({
        "bootstrap.servers": args.bootstrap, "group.id": args.group,
        "isolation.level": "read_committed", "enable.auto.commit": False,
        "auto.offset.reset": "earliest", "max.poll.records": args.batch,
        "session.timeout.ms": 6000, "heartbeat.interval.ms": 1000,
    })
    producer = Producer({
        "bootstrap.servers": args.bootstrap, "transactional.id": args.transactional_id,
        "linger.ms": 1, "transaction.timeout.ms": 10000,
    })
    try:
        producer.init_transactions(60)
        consumer.subscribe([args.source])
        last_input = time.monotonic()
        committed = 0
        while time.monotonic() - last_input < args.idle_exit_s:
            records = consumer.poll(0.5)
            if not records:
                continue
            last_input = time.monotonic()
            producer.begin_transaction()
            try:
                positions: dict[TopicPartition, int] = {}
                for record in records:
                    producer.send(args.sink, b"shipped:" + (record.value or b""), key=record.key)
                    positions[TopicPartition(record.topic, record.partition)] = record.offset + 1
                producer.send_offsets_to_transaction(
                    positions, consumer.consumer_group_metadata(), 60
                )
                producer.commit_transaction(60)
            except TransactionError as exc:
                if exc.fatal:
                    raise
                producer.abort_transaction(60)
                # Back to the last committed input: the aborted outputs are never visible.
                for tp, offset in consumer.committed(list(positions), timeout=30).items():
                    consumer.seek(tp, offset if offset is not None else 0)
                continue
            committed += len(records)
            print(f"committed {committed}", flush=True)
        return 0
    except TransactionError as exc:
        if exc.code in (ErrorCode.PRODUCER_FENCED, ErrorCode.INVALID_PRODUCER_EPOCH):
            print(f"fenced: {exc}", flush=True)
            return FENCED_EXIT
        print(f"fatal: {exc}", flush=True)
        return 1
    finally:
        consumer.close()
        producer.close(5)


if __name__ == "__main__":
    sys.exit(main())
