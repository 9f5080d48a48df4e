"""kafka-delete-records.sh's offset JSON as ``fjord delete-records`` reads it: every malformed
file is an INVALID_REQUEST naming what is wrong."""

from __future__ import annotations

import pytest

from fjord.cli.delete_records_cmd import parse_offset_json
from fjord.client import TopicPartition
from fjord.errors import InvalidRequestError


def test_kafkas_format_is_read() -> None:
    text = ('{"partitions": [{"topic": "a", "partition": 0, "offset": 3}, '
            '{"topic": "a", "partition": 1, "offset": -1}], "version": 1}')
    assert parse_offset_json(text) == {TopicPartition("a", 0): 3, TopicPartition("a", 1): -1}


@pytest.mark.parametrize(("text", "needle"), [
    ("[1]", '"partitions" list'),
    ('{"partitions": {}}', '"partitions" list'),
    ('{"partitions": [], "version": 1}', "is empty"),
    ('{"partitions": [{"topic": "a", "partition": 0, "offset": 1}], "version": 2}', "version 2"),
    ('{"partitions": [7]}', "partitions[0] must be an object"),
    ('{"partitions": [{"topic": "", "partition": 0, "offset": 1}]}', '"topic" string'),
    ('{"partitions": [{"topic": "a", "partition": -1, "offset": 1}]}', '"partition" integer'),
    ('{"partitions": [{"topic": "a", "partition": true, "offset": 1}]}', '"partition" integer'),
    ('{"partitions": [{"topic": "a", "partition": 0, "offset": "5"}]}', '"offset" integer'),
    ('{"partitions": [{"topic": "a", "partition": 0, "offset": 1, "x": 1}]}', "unknown field"),
])
def test_malformed_files_are_refused_naming_the_problem(text: str, needle: str) -> None:
    with pytest.raises(InvalidRequestError, match=None) as caught:
        parse_offset_json(text)
    assert needle in str(caught.value)
