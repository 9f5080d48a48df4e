"""Shared pieces of the client-side commands (topics, produce, consume, cluster, perf):
bootstrap resolution, ``--output``, ``k=v`` parsing and turning errors into one stderr line."""

from __future__ import annotations

import contextlib
import functools
import json
import os
import socket
import sys
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, NoReturn, TypeVar

import click
from tabulate import tabulate

from fjord.config import (
    BOOTSTRAP_ENV_VAR,
    DEFAULT_BOOTSTRAP_SERVERS,
    bootstrap_from_environment,
    parse_host_port,
)
from fjord.errors import ConfigError, FjordError
from fjord.security import parse_properties

F = TypeVar("F", bound=Callable[..., Any])

BROKEN_PIPE_EXIT_STATUS = 141
"""Exit status when stdout's reader closed the pipe: 128 + SIGPIPE, as a shell reports for a
Unix tool killed by SIGPIPE."""

CLI_API_TIMEOUT_MS = 15000
"""``default.api.timeout.ms`` of the commands' admin client: a command against an unreachable
cluster fails after this long, not after the library's 60 s."""


CONNECT_PROBE_TIMEOUT_S = 3.0
"""How long a command's first TCP connect to each bootstrap address may take before the
address counts as unreachable (a refused connection fails at once)."""


COMMAND_CONFIG_META = "fjord.command_config"


def _store_command_config(ctx: click.Context, _param: click.Parameter, path: str | None) -> None:
    if path is None:
        return
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as exc:
        raise click.BadParameter(
            f"cannot read {path}: {exc.strerror or exc}", param_hint="--command-config"
        ) from exc
    try:
        ctx.meta[COMMAND_CONFIG_META] = parse_properties(text, path)
    except ConfigError as exc:
        raise click.BadParameter(str(exc), param_hint="--command-config") from exc


def command_config() -> dict[str, str]:
    """The client properties of ``--command-config FILE`` (Kafka's tools' option: e.g.
    ``security.protocol=SSL`` and the ``ssl.*`` files), {} without one. Every client the
    command builds starts from them; the command's own flags win."""
    ctx = click.get_current_context(silent=True)
    return dict(ctx.meta.get(COMMAND_CONFIG_META, {})) if ctx is not None else {}


def admin_client_config(bootstrap_server: str | None) -> dict[str, Any]:
    return {
        **command_config(),
        "bootstrap.servers": bootstrap_for_command(bootstrap_server),
        "default.api.timeout.ms": CLI_API_TIMEOUT_MS,
    }


def local_cluster_bootstrap(start: Path | None = None) -> str | None:
    """The bootstrap servers of the running ``fjord local`` cluster found from ``start`` (the
    current directory) as :func:`fjord.local.find_data_dir` finds it (``FJORD_DATA_DIR``, else
    the nearest ``.fjord`` here or above): None when there is none, or when its state file
    says it is stopped."""
    from fjord.local.cluster import ClusterStateError, read_state
    from fjord.local.find import find_data_dir

    data_dir = find_data_dir(start)
    if data_dir is None:
        return None
    try:
        state = read_state(data_dir, missing_ok=True)
    except (ClusterStateError, OSError):
        return None
    if not state or not state.get("processes"):
        return None
    servers = state.get("bootstrap_servers")
    return str(servers) if servers else None


def resolve_bootstrap(option: str | None) -> str:
    """``--bootstrap-server``, else ``FJORD_BOOTSTRAP_SERVERS``, else the local cluster's state
    file, else ``localhost:9092``."""
    return resolve_bootstrap_source(option)[0]


def resolve_bootstrap_source(option: str | None) -> tuple[str, str]:
    """The bootstrap servers as :func:`resolve_bootstrap` picks them, and where they came from,
    in words for an error message."""
    if option:
        return option, "--bootstrap-server"
    from_env = bootstrap_from_environment()
    if from_env:
        return from_env, BOOTSTRAP_ENV_VAR
    local = local_cluster_bootstrap()
    if local:
        return local, "the local cluster's state file"
    return DEFAULT_BOOTSTRAP_SERVERS, "the default"


def unreachable_reason(address: str, timeout: float = CONNECT_PROBE_TIMEOUT_S) -> str | None:
    """Why a TCP connection to ``host:port`` cannot be opened ("connection refused", "timed
    out", ...), or None when it can."""
    try:
        host, port = parse_host_port(address)
    except ConfigError as exc:
        return str(exc)
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return None
    except ConnectionRefusedError:
        return "connection refused"
    except TimeoutError:
        return f"no answer within {timeout:g} s"
    except socket.gaierror as exc:
        return f"unknown host ({exc.strerror})"
    except OSError as exc:
        return exc.strerror or str(exc)


def bootstrap_for_command(option: str | None) -> str:
    """The bootstrap servers a client command uses, checked: when no address accepts a TCP
    connection the command fails at once (ClickException) naming every address tried and why,
    where the addresses came from and, for the default, that ``fjord local up`` starts a
    cluster; instead of retrying until the API timeout."""
    servers, source = resolve_bootstrap_source(option)
    addresses = [a.strip() for a in servers.split(",") if a.strip()]
    reasons = []
    for address in addresses:
        reason = unreachable_reason(address)
        if reason is None:
            return servers
        reasons.append(f"{address} ({reason})")
    message = f"cannot reach the cluster: {', '.join(reasons)}; bootstrap servers from {source}"
    if source == "the default":
        from fjord.local.find import find_data_dir

        found = find_data_dir()
        if found is not None:
            message += f" (the local cluster in {found} is stopped)"
        else:
            message += (
                f" (no --bootstrap-server, no {BOOTSTRAP_ENV_VAR} and no running local cluster"
                " in this directory or above)"
            )
        message += "; start one with `fjord local up`"
    elif source == "the local cluster's state file":
        message += "; is it still running? see `fjord local status`"
    raise click.ClickException(f"NETWORK_EXCEPTION: {message}")


def bootstrap_option(fn: F) -> F:
    """``--bootstrap-server`` and ``--command-config FILE`` (read with :func:`command_config`)."""
    fn = click.option(
        "--command-config",
        default=None,
        metavar="FILE",
        expose_value=False,
        is_eager=True,
        callback=_store_command_config,
        help="Client properties file, as Kafka's tools take it (security.protocol=SSL, "
        "ssl.ca.location, ssl.certificate.location, ssl.key.location, ...).",
    )(fn)
    return click.option(
        "--bootstrap-server",
        "bootstrap_server",
        default=None,
        metavar="HOST:PORT[,...]",
        help="Brokers to connect to (default: FJORD_BOOTSTRAP_SERVERS, then the running "
        "`fjord local` cluster of this directory or a parent, or of FJORD_DATA_DIR, then "
        f"{DEFAULT_BOOTSTRAP_SERVERS}).",
    )(fn)


def output_option(fn: F) -> F:
    return click.option(
        "--output",
        "-o",
        "output",
        type=click.Choice(["table", "json"]),
        default="table",
        show_default=True,
        help="Readable table, or JSON for scripts.",
    )(fn)


def parse_pairs(items: Iterable[str], option: str) -> dict[str, str]:
    """``k=v`` items as a dict (BadParameter naming the option for anything else)."""
    out: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise click.BadParameter(f"expected k=v, got {item!r}", param_hint=option)
        out[key.strip()] = value.strip()
    return out


def friendly_errors(fn: F) -> F:
    """Errors become one line on stderr and exit status 1, never a traceback."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except (click.ClickException, click.exceptions.Exit, click.Abort, BrokenPipeError):
            raise  # a closed pipe is not an error: the command group ends quietly
        except FjordError as exc:
            raise click.ClickException(f"{exc.code.name}: {exc}") from None
        except (TimeoutError, OSError, TypeError, ValueError) as exc:
            raise click.ClickException(f"{type(exc).__name__}: {exc}") from None
        except KeyboardInterrupt:
            sys.exit(130)

    return wrapper  # type: ignore[return-value]


def exit_quietly_on_broken_pipe() -> NoReturn:
    """End the process as Unix tools do when the reader of stdout went away (``fjord consume |
    head -2``): no message, status 141 (128 + SIGPIPE, what a shell reports for ``yes | head``).

    stdout is pointed at /dev/null first, so the interpreter's final flush cannot fail again."""
    with contextlib.suppress(OSError, ValueError, AttributeError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    raise SystemExit(BROKEN_PIPE_EXIT_STATUS)


def emit(output: str, data: Any, rows: Sequence[Sequence[Any]], headers: Sequence[str]) -> None:
    """Print ``data`` as JSON, or ``rows`` as a table."""
    if output == "json":
        click.echo(json.dumps(data, indent=2, sort_keys=True))
    elif rows:
        click.echo(tabulate(rows, headers=list(headers)))
