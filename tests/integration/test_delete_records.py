"""DeleteRecords against the shared cluster: ``fjord delete-records --offset-json-file`` (Kafka's
kafka-delete-records.sh) and ``AdminClient.delete_records`` move the log start offset on the
partition's leader; bad input (an offset past the high watermark, an unknown topic or
partition, a malformed file) is refused naming the problem, and nothing is deleted."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from fjord.cli.main import cli
from fjord.client import AdminClient, Consumer, NewTopic, Producer, TopicPartition
from fjord.errors import OffsetOutOfRangeError, UnknownTopicOrPartitionError

pytestmark = pytest.mark.integration

RECORDS = 10


@pytest.fixture(scope="module")
def topic(bootstrap: str) -> str:
    """Two partitions (replication factor 2) with RECORDS records each, all acknowledged."""
    name = f"delrec-{uuid.uuid4().hex[:8]}"
    with AdminClient({"bootstrap.servers": bootstrap}) as admin:
        admin.create_topics([NewTopic(name, 2, 2)])
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all"})
    try:
        for partition in (0, 1):
            for i in range(RECORDS):
                producer.send(name, f"v{i}".encode(), partition=partition)
        producer.flush(30)
    finally:
        producer.close()
    return name


def starts(admin: AdminClient, topic: str) -> dict[int, int | None]:
    found = admin.list_offsets({TopicPartition(topic, p): "earliest" for p in (0, 1)})
    return {tp.partition: offset for tp, offset in found.items()}


def delete_with_cli(bootstrap: str, tmp_path: Path, content: str) -> Result:
    path = tmp_path / f"offsets-{uuid.uuid4().hex[:6]}.json"
    path.write_text(content)
    return CliRunner().invoke(cli, ["delete-records", "--bootstrap-server", bootstrap,
                                    "--offset-json-file", str(path)])


def one_line_error(result: Result, *needles: str) -> None:
    assert result.exit_code != 0, result.output
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]


def test_cli_moves_the_log_start_and_consumers_begin_there(
    bootstrap: str, topic: str, tmp_path: Path
) -> None:
    offsets = {"partitions": [{"topic": topic, "partition": 0, "offset": 4}], "version": 1}
    result = delete_with_cli(bootstrap, tmp_path, json.dumps(offsets))
    assert result.exit_code == 0, (result.output, result.stderr)
    assert f"partition: {topic}-0\tlow_watermark: 4" in result.stdout
    with AdminClient({"bootstrap.servers": bootstrap}) as admin:
        assert starts(admin, topic) == {0: 4, 1: 0}
    consumer = Consumer({"bootstrap.servers": bootstrap, "auto.offset.reset": "earliest",
                         "enable.auto.commit": False})
    try:
        consumer.assign([TopicPartition(topic, 0)])
        consumer.seek_to_beginning()
        got: list[int] = []
        for _ in range(50):
            got += [r.offset for r in consumer.poll(1.0)]
            if len(got) >= RECORDS - 4:
                break
        assert got == list(range(4, RECORDS))
    finally:
        consumer.close()


def test_bad_input_is_refused_and_changes_nothing(
    bootstrap: str, topic: str, tmp_path: Path
) -> None:
    with AdminClient({"bootstrap.servers": bootstrap}) as admin:
        before = starts(admin, topic)
        # Past the high watermark, beside a valid entry: OFFSET_OUT_OF_RANGE naming the
        # partition, and the valid entry is not applied either.
        bad = {"partitions": [{"topic": topic, "partition": 1, "offset": 2},
                              {"topic": topic, "partition": 0, "offset": RECORDS + 5}]}
        one_line_error(delete_with_cli(bootstrap, tmp_path, json.dumps(bad)),
                       "OFFSET_OUT_OF_RANGE", f"{topic}-0", f"offset {RECORDS + 5}",
                       f"high watermark {RECORDS}")
        with pytest.raises(OffsetOutOfRangeError, match=f"{topic}-1: offset -7"):
            admin.delete_records({TopicPartition(topic, 1): -7})
        missing = {"partitions": [{"topic": f"{topic}-nope", "partition": 0, "offset": 1}]}
        one_line_error(delete_with_cli(bootstrap, tmp_path, json.dumps(missing)),
                       "UNKNOWN_TOPIC_OR_PARTITION", f"{topic}-nope")
        with pytest.raises(UnknownTopicOrPartitionError, match=f"{topic}-9"):
            admin.delete_records({TopicPartition(topic, 9): 1})
        one_line_error(delete_with_cli(bootstrap, tmp_path, "{not json"),
                       "INVALID_REQUEST", "not valid JSON")
        one_line_error(delete_with_cli(bootstrap, tmp_path, json.dumps(
            {"partitions": [{"topic": topic, "partition": 0}]})), "INVALID_REQUEST",
            "partitions[0]", '"offset"')
        one_line_error(delete_with_cli(bootstrap, tmp_path, json.dumps(
            {"partitions": [{"topic": topic, "partition": 1, "offset": 1}] * 2})),
            "INVALID_REQUEST", f"{topic}-1 more than once")
        missing_file = CliRunner().invoke(cli, [
            "delete-records", "--bootstrap-server", bootstrap,
            "--offset-json-file", str(tmp_path / "absent.json")])
        assert missing_file.exit_code != 0 and "absent.json" in missing_file.stderr
        assert starts(admin, topic) == before


def test_admin_client_deletes_up_to_the_high_watermark(bootstrap: str, topic: str) -> None:
    with AdminClient({"bootstrap.servers": bootstrap}) as admin:
        low = admin.delete_records({TopicPartition(topic, 1): -1})
        assert low == {TopicPartition(topic, 1): RECORDS}
        assert starts(admin, topic)[1] == RECORDS
        # Deleting below the current start is not an error and moves nothing (Kafka's).
        assert admin.delete_records({TopicPartition(topic, 1): 3}) == {
            TopicPartition(topic, 1): RECORDS
        }
