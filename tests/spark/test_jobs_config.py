"""Properties of the jobs' configuration parsing that need no SparkSession: any warehouse table
with distinct skus round-trips through its CSV form, and a table naming a sku twice is refused;
``--command-config`` (a client properties file such as a FjordUser's client.properties) reaches
every source and sink as Spark's ``kafka.``-prefixed options, and a bad file is refused naming
it."""

from __future__ import annotations

import csv
import io
import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fjord.errors import ConfigError
from fjord_jobs.common import JobOptions, client_options, job_options
from fjord_jobs.defaults import DEFAULT_BOOTSTRAP_SERVERS
from fjord_jobs.orders_shipments import WAREHOUSE_SCHEMA, build_parser, main, read_warehouses_csv
from fjord_spark.options import parse_reader_options, parse_writer_options

# Printable text without surrounding spaces (the reader strips them) and not empty.
_field = (
    st.text(
        st.characters(blacklist_categories=("Cc", "Cs", "Zl", "Zp"), blacklist_characters="\r\n"),
        min_size=1,
        max_size=12,
    )
    .map(str.strip)
    .filter(bool)
)
_row = st.tuples(_field, _field, _field, st.integers(min_value=0, max_value=365))
_tables = st.lists(_row, min_size=1, max_size=8, unique_by=lambda row: row[0])


def write_table(rows: list[tuple[str, str, str, int]]) -> Path:
    buffer = io.StringIO()
    writer = csv.writer(buffer)
    writer.writerow(WAREHOUSE_SCHEMA.fieldNames())
    writer.writerows(rows)
    with tempfile.NamedTemporaryFile(
        "w", suffix=".csv", delete=False, encoding="utf-8", newline=""
    ) as handle:
        handle.write(buffer.getvalue())
    return Path(handle.name)


@settings(max_examples=60, deadline=None)
@given(_tables)
def test_warehouse_tables_round_trip_through_csv(rows: list[tuple[str, str, str, int]]) -> None:
    path = write_table(rows)
    try:
        assert read_warehouses_csv(path) == rows
    finally:
        path.unlink()


@settings(max_examples=30, deadline=None)
@given(_tables, st.data())
def test_a_sku_listed_twice_is_refused(
    rows: list[tuple[str, str, str, int]], data: st.DataObject
) -> None:
    repeated = data.draw(st.sampled_from(rows))
    path = write_table([*rows, (repeated[0], "OTHER", "OTHER", 1)])
    try:
        with pytest.raises(ConfigError, match="listed twice"):
            read_warehouses_csv(path)
    finally:
        path.unlink()


# -- --command-config: a client properties file, as Kafka's tools take it ----------------------

FJORD_USER_PROPERTIES = """# FjordUser fjord-orders-shipments: mount this Secret at /etc/fjord-user
# Fjord's clients (gRPC): bootstrap.servers=fjord-broker.fjord.svc:9092
security.protocol=SSL
ssl.ca.location=/etc/fjord-user/ca.crt
ssl.certificate.location=/etc/fjord-user/user.crt
ssl.key.location=/etc/fjord-user/user.key
"""


def parse_job_args(*args: str) -> JobOptions:
    return job_options(build_parser().parse_args(["--checkpoint", "/ckpt", *args]))


def test_a_command_config_reaches_every_source_and_sink_as_kafka_options(tmp_path: Path) -> None:
    config = tmp_path / "client.properties"
    config.write_text(FJORD_USER_PROPERTIES)
    options = parse_job_args("--bootstrap-servers", "b:9092", "--command-config", str(config))
    assert options.client_properties == {
        "security.protocol": "SSL",
        "ssl.ca.location": "/etc/fjord-user/ca.crt",
        "ssl.certificate.location": "/etc/fjord-user/user.crt",
        "ssl.key.location": "/etc/fjord-user/user.key",
    }
    assert client_options(options) == {
        "kafka.security.protocol": "SSL",
        "kafka.ssl.ca.location": "/etc/fjord-user/ca.crt",
        "kafka.ssl.certificate.location": "/etc/fjord-user/user.crt",
        "kafka.ssl.key.location": "/etc/fjord-user/user.key",
        "kafka.bootstrap.servers": "b:9092",
    }
    # What the data source makes of them: the same client properties on both sides.
    reader = parse_reader_options(
        {**client_options(options), "subscribe": "orders"}, streaming=True
    )
    writer = parse_writer_options(client_options(options))
    assert dict(reader.client_properties) == dict(writer.client_properties)
    assert reader.client_properties["ssl.key.location"] == "/etc/fjord-user/user.key"


def test_without_a_command_config_the_jobs_options_are_as_before() -> None:
    options = parse_job_args()
    assert options.bootstrap_servers == DEFAULT_BOOTSTRAP_SERVERS
    assert options.client_properties == {}
    assert client_options(options) == {"kafka.bootstrap.servers": DEFAULT_BOOTSTRAP_SERVERS}


def test_bootstrap_servers_flag_wins_over_the_files(tmp_path: Path) -> None:
    config = tmp_path / "client.properties"
    config.write_text("bootstrap.servers=from-file:9092\nclient.id=job\n")
    assert parse_job_args("--command-config", str(config)).bootstrap_servers == "from-file:9092"
    flagged = parse_job_args("--command-config", str(config), "--bootstrap-servers", "flag:1")
    assert flagged.bootstrap_servers == "flag:1"
    assert flagged.client_properties == {"client.id": "job"}  # not passed twice


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("acks=all\n", r"'acks' is not a setting every client of the job takes"),
        ("isolation.level=read_committed\n", r"'isolation.level' is not a setting every"),
        ("security.protocol SSL\n", r"line 1: expected key=value"),
        ("security.protocol=SASL_SSL\nsasl.mechanism=SCRAM-SHA-512\n", r"sasl.username"),
        ("security.protocol=SSL\nssl.key.location=/k\n", r"ssl.certificate.location"),
        ("security.protocol=TLS\n", r"security.protocol"),
    ],
)
def test_a_bad_command_config_is_refused_naming_the_file(
    tmp_path: Path, text: str, error: str
) -> None:
    config = tmp_path / "bad.properties"
    config.write_text(text)
    with pytest.raises(ConfigError, match=error) as refused:
        parse_job_args("--command-config", str(config))
    assert str(config) in str(refused.value)


def test_an_unreadable_command_config_is_refused_and_the_cli_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "absent.properties"
    with pytest.raises(ConfigError, match=r"--command-config: cannot read .*absent.properties"):
        parse_job_args("--command-config", str(missing))
    # The job's CLI turns it into a usage error before any Spark session starts.
    with pytest.raises(SystemExit) as exited:
        main(["--checkpoint", str(tmp_path / "ckpt"), "--command-config", str(missing)])
    assert exited.value.code == 2
    assert "cannot read" in capsys.readouterr().err
