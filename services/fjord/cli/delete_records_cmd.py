"""``fjord delete-records --offset-json-file FILE``: Kafka's kafka-delete-records.sh. Each
partition named in the file gets its log start offset moved up to the given offset (-1: its high
watermark); the records below can no longer be read. The file is kafka-delete-records.sh's:

    {"partitions": [{"topic": "orders", "partition": 0, "offset": 42}], "version": 1}

Everything is checked before anything is deleted (the file, the topics and partitions, each
offset against the partition's high watermark), so a bad file changes nothing.
"""

from __future__ import annotations

import json
from pathlib import Path

import click

from fjord.cli.client_common import (
    admin_client_config,
    bootstrap_option,
    emit,
    friendly_errors,
    output_option,
)
from fjord.client import AdminClient, TopicPartition
from fjord.errors import InvalidRequestError

#: The version kafka-delete-records.sh writes and reads.
OFFSET_JSON_VERSION = 1


def parse_offset_json(text: str, source: str = "the offset JSON") -> dict[TopicPartition, int]:
    """kafka-delete-records.sh's offset JSON as {partition: offset}; INVALID_REQUEST naming
    what is wrong (not JSON, no ``partitions`` list, an entry without a string ``topic``, an
    integer ``partition`` >= 0 or an integer ``offset``, an unknown version, a partition named
    twice) otherwise."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InvalidRequestError(f"{source} is not valid JSON: {exc}") from None
    if not isinstance(data, dict) or not isinstance(data.get("partitions"), list):
        raise InvalidRequestError(
            f'{source} must be an object with a "partitions" list, as '
            '{"partitions": [{"topic": "t", "partition": 0, "offset": 42}], "version": 1}'
        )
    version = data.get("version", OFFSET_JSON_VERSION)
    if version != OFFSET_JSON_VERSION:
        raise InvalidRequestError(f"{source}: version {version!r} is not supported (only 1)")
    out: dict[TopicPartition, int] = {}
    for i, entry in enumerate(data["partitions"]):
        where = f"{source}: partitions[{i}]"
        if not isinstance(entry, dict):
            raise InvalidRequestError(f"{where} must be an object, got {entry!r}")
        unknown = sorted(set(entry) - {"topic", "partition", "offset"})
        if unknown:
            raise InvalidRequestError(f"{where} has unknown field(s) {', '.join(unknown)}")
        topic, partition, offset = entry.get("topic"), entry.get("partition"), entry.get("offset")
        if not isinstance(topic, str) or not topic:
            raise InvalidRequestError(f'{where} needs a "topic" string, got {topic!r}')
        if not isinstance(partition, int) or isinstance(partition, bool) or partition < 0:
            raise InvalidRequestError(
                f'{where} needs a "partition" integer >= 0, got {partition!r}'
            )
        if not isinstance(offset, int) or isinstance(offset, bool):
            raise InvalidRequestError(
                f'{where} needs an "offset" integer (-1: the high watermark), got {offset!r}'
            )
        tp = TopicPartition(topic, partition)
        if tp in out:
            raise InvalidRequestError(
                f"{source} names partition {topic}-{partition} more than once"
            )
        out[tp] = offset
    if not out:
        raise InvalidRequestError(f'{source}: "partitions" is empty, nothing to delete')
    return out


@click.command("delete-records")
@bootstrap_option
@output_option
@click.option(
    "--offset-json-file",
    "offset_json_file",
    required=True,
    type=click.Path(dir_okay=False, path_type=Path),
    help='kafka-delete-records.sh\'s JSON: {"partitions": [{"topic": "t", "partition": 0, '
    '"offset": 42}], "version": 1}; offset -1 deletes up to the high watermark.',
)
@friendly_errors
def delete_records(bootstrap_server: str | None, output: str, offset_json_file: Path) -> None:
    """Delete the records below the given offsets (moves each partition's log start offset),
    like kafka-delete-records.sh. Nothing is deleted when any entry is wrong."""
    try:
        text = offset_json_file.read_text()
    except OSError as exc:
        raise click.BadParameter(
            f"cannot read {str(offset_json_file)!r}: {exc.strerror or exc}",
            param_hint="--offset-json-file",
        ) from None
    offsets = parse_offset_json(text, str(offset_json_file))
    with AdminClient(admin_client_config(bootstrap_server)) as admin:
        low = admin.delete_records(offsets)
    rows = [(f"{tp.topic}-{tp.partition}", low[tp]) for tp in sorted(low)]
    if output == "json":
        emit(output, {"partitions": [
            {"topic": tp.topic, "partition": tp.partition, "low_watermark": low[tp]}
            for tp in sorted(low)
        ]}, [], [])
        return
    click.echo("Records delete operation completed:")
    for name, watermark in rows:
        click.echo(f"partition: {name}\tlow_watermark: {watermark}")
