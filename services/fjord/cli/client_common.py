"""Shared pieces of the client-side commands (topics, produce, consume, cluster, perf):
bootstrap resolution, ``--output``, ``k=v`` parsing and turning errors into one stderr line."""

from __future__ import annotations

import functools
import json
import sys
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import click
from tabulate import tabulate

from fjord.config import DEFAULT_BOOTSTRAP_SERVERS, bootstrap_from_environment
from fjord.errors import FjordError

F = TypeVar("F", bound=Callable[..., Any])

CLI_API_TIMEOUT_MS = 15000
"""``default.api.timeout.ms`` of the commands' admin client: a command against an unreachable
cluster fails after this long, not after the library's 60 s."""


def admin_client_config(bootstrap_server: str | None) -> dict[str, Any]:
    return {
        "bootstrap.servers": resolve_bootstrap(bootstrap_server),
        "default.api.timeout.ms": CLI_API_TIMEOUT_MS,
    }


def local_cluster_bootstrap(start: Path | None = None) -> str | None:
    """The bootstrap servers of a running ``fjord local`` cluster whose data directory is the
    default one under ``start`` (the current directory): None when there is none, or when its
    state file says it is stopped."""
    from fjord.local.cluster import ClusterStateError, read_state
    from fjord.local.defaults import DEFAULT_DATA_DIR

    try:
        state = read_state((start or Path.cwd()) / DEFAULT_DATA_DIR, missing_ok=True)
    except (ClusterStateError, OSError):
        return None
    if not state or not state.get("processes"):
        return None
    servers = state.get("bootstrap_servers")
    return str(servers) if servers else None


def resolve_bootstrap(option: str | None) -> str:
    """``--bootstrap-server``, else ``FJORD_BOOTSTRAP_SERVERS``, else the local cluster's state
    file, else ``localhost:9092``."""
    return (
        option
        or bootstrap_from_environment()
        or local_cluster_bootstrap()
        or DEFAULT_BOOTSTRAP_SERVERS
    )


def bootstrap_option(fn: F) -> F:
    return click.option(
        "--bootstrap-server",
        "bootstrap_server",
        default=None,
        metavar="HOST:PORT[,...]",
        help="Brokers to connect to (default: FJORD_BOOTSTRAP_SERVERS, then the running "
        f"`fjord local` cluster, then {DEFAULT_BOOTSTRAP_SERVERS}).",
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
        except (click.ClickException, click.exceptions.Exit, click.Abort):
            raise
        except FjordError as exc:
            raise click.ClickException(f"{exc.code.name}: {exc}") from None
        except (TimeoutError, OSError, TypeError, ValueError) as exc:
            raise click.ClickException(f"{type(exc).__name__}: {exc}") from None
        except KeyboardInterrupt:
            sys.exit(130)

    return wrapper  # type: ignore[return-value]


def emit(output: str, data: Any, rows: Sequence[Sequence[Any]], headers: Sequence[str]) -> None:
    """Print ``data`` as JSON, or ``rows`` as a table."""
    if output == "json":
        click.echo(json.dumps(data, indent=2, sort_keys=True))
    elif rows:
        click.echo(tabulate(rows, headers=list(headers)))
