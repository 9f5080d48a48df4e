"""Pure helpers of the client commands: percentiles, record formatting, k=v parsing, errors."""

from __future__ import annotations

import click
import pytest
from click.testing import CliRunner

from fjord.cli.client_common import friendly_errors, parse_pairs
from fjord.cli.console_cmd import _format_record, record_json
from fjord.cli.perf_cmd import percentile
from fjord.client import ConsumerRecord
from fjord.errors import ConfigError, OffsetOutOfRangeError

RECORD = ConsumerRecord("t", 2, 41, b"k", b"\xff\x00", (("h", b"1"), ("n", None)), 1234)


def test_percentile_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]
    assert percentile(values, 0.5) == 50
    assert percentile(values, 0.99) == 99
    assert percentile(values, 1.0) == 100
    assert percentile([7.0], 0.95) == 7
    assert percentile([], 0.5) == 0


def test_console_formatting() -> None:
    assert _format_record(RECORD._replace(value=b"v"), {}) == "v"
    props = {
        "print.key": "true",
        "print.offset": "true",
        "print.partition": "true",
        "print.timestamp": "true",
        "print.headers": "true",
        "key.separator": "|",
    }
    line = _format_record(RECORD._replace(value=None), props)
    assert line == "CreateTime:1234|Partition:2|Offset:41|h:1,n:null|k|null"


def test_record_json_keeps_binary_values() -> None:
    data = record_json(RECORD)
    assert data["key"] == "k" and data["value"] == {"base64": "/wA="}
    assert data["headers"] == [["h", "1"], ["n", None]]
    assert (data["partition"], data["offset"], data["timestamp"]) == (2, 41, 1234)


def test_parse_pairs() -> None:
    assert parse_pairs(["a=1", " b = x=y "], "--config") == {"a": "1", "b": "x=y"}
    with pytest.raises(click.BadParameter, match="expected k=v"):
        parse_pairs(["novalue"], "--config")
    with pytest.raises(click.BadParameter):
        parse_pairs(["=v"], "--config")


@pytest.mark.parametrize(
    ("error", "shown"),
    [
        (ConfigError("unknown key 'x'"), "INVALID_CONFIG: unknown key 'x'"),
        (OffsetOutOfRangeError("too far"), "OFFSET_OUT_OF_RANGE: too far"),
        (TimeoutError("slow"), "TimeoutError: slow"),
    ],
)
def test_errors_become_one_line(error: Exception, shown: str) -> None:
    @click.command()
    @friendly_errors
    def boom() -> None:
        raise error

    result = CliRunner().invoke(boom, [])
    assert result.exit_code == 1
    assert result.stderr.strip().splitlines() == [f"Error: {shown}"]
    assert "Traceback" not in result.stderr


def test_every_subcommand_resolves_to_a_command_of_its_name() -> None:
    from fjord.cli.main import COMMANDS, cli

    context = click.Context(cli)
    for name in COMMANDS:
        command = cli.get_command(context, name)
        assert isinstance(command, click.Command) and command.name == name, name
    assert cli.list_commands(context) == sorted(COMMANDS)
    help_text = CliRunner().invoke(cli, ["--help"]).output
    assert all(f"  {name}" in help_text for name in COMMANDS), help_text


def test_a_client_command_loads_no_service_code() -> None:
    """`fjord topics list` (here its --help, the same imports) in a fresh interpreter loads the
    client, not the broker, controller, coordinator, Kafka listener or operator."""
    import subprocess
    import sys

    probe = (
        "import sys\n"
        "from click.testing import CliRunner\n"
        "from fjord.cli.main import cli\n"
        "result = CliRunner().invoke(cli, ['topics', 'list', '--help'])\n"
        "assert result.exit_code == 0, result.output\n"
        "print(sorted(m for m in sys.modules if m.split('.')[:2] in (['fjord', 'broker'], "
        "['fjord', 'controller'], ['fjord', 'coordinator'], ['fjord', 'kafka']) "
        "or m.startswith(('kopf', 'fjord_operator'))))\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          timeout=60)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]", done.stdout


def test_local_up_authorization_needs_secure_and_acls_needs_an_action(tmp_path) -> None:
    from fjord.cli.main import cli

    result = CliRunner().invoke(cli, ["local", "up", "--authorization", "--data-dir",
                                      str(tmp_path)])
    assert result.exit_code == 2 and "--authorization needs --secure" in result.output
    assert not any(tmp_path.iterdir())  # refused before anything was made
    result = CliRunner().invoke(cli, ["acls", "--topic", "orders"])
    assert result.exit_code == 2 and "give one of --add, --remove, --list" in result.output


def test_service_authorization_settings_from_the_security_config(tmp_path) -> None:
    from fjord.cli.security_options import load_authorization
    from fjord.security.acls import AuthorizerSettings

    path = tmp_path / "svc.properties"
    base = "ssl.keystore.location=/k.pem\nssl.truststore.location=/ca.pem\n"
    on = "authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer\n"
    assert load_authorization(None) is None
    path.write_text(base)
    assert load_authorization(str(path)) is None
    path.write_text(base + on + "super.users=User:admin\n")
    assert load_authorization(str(path)) == AuthorizerSettings(frozenset({"User:admin"}))
    for extra, message in ((on + "ssl.client.auth=none\n", "ssl.client.auth=required"),
                           ("authorizer.class.name=my.Own\n", "unknown authorizer"),
                           ("super.users=User:x\n", "without authorizer.class.name")):
        path.write_text(base + extra)
        with pytest.raises(click.UsageError, match=message):
            load_authorization(str(path))
