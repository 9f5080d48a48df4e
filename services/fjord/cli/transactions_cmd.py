"""``fjord transactions list|describe``: Kafka's kafka-transactions.sh views, from every
coordinator's transactional ids (AdminClient.list_transactions)."""

from __future__ import annotations

import click

from fjord.cli.client_common import (
    admin_client_config,
    bootstrap_option,
    emit,
    friendly_errors,
    output_option,
)
from fjord.client import AdminClient
from fjord.client.admin import TransactionDescription
from fjord.errors import ErrorCode, FjordError

LIST_HEADERS = ("TransactionalId", "Coordinator", "ProducerId", "TransactionState")
DESCRIBE_HEADERS = (
    "CoordinatorId", "TransactionalId", "ProducerId", "ProducerEpoch", "TransactionState",
    "TransactionTimeoutMs", "CurrentTransactionStartTimeMs", "TopicPartitions",
)


def _json(t: TransactionDescription) -> dict[str, object]:
    return {
        "transactional_id": t.transactional_id, "coordinator": t.coordinator_id,
        "producer_id": t.producer_id, "producer_epoch": t.producer_epoch, "state": t.state,
        "transaction_timeout_ms": t.transaction_timeout_ms,
        "transaction_start_time_ms": t.transaction_start_time_ms,
        "partitions": [f"{tp.topic}-{tp.partition}" for tp in t.partitions],
    }


@click.group("transactions")
def transactions() -> None:
    """List and describe transactional ids (kafka-transactions.sh)."""


@transactions.command("list")
@bootstrap_option
@output_option
@click.option("--state", "states", multiple=True,
              help="Only these states (Kafka's names: Ongoing, CompleteCommit, ...).")
@friendly_errors
def list_(bootstrap_server: str | None, output: str, states: tuple[str, ...]) -> None:
    """Every transactional id of every coordinator."""
    with AdminClient(admin_client_config(bootstrap_server)) as admin:
        listed = admin.list_transactions(states or None)
    emit(output, [_json(t) for t in listed],
         [(t.transactional_id, t.coordinator_id, t.producer_id, t.state) for t in listed],
         LIST_HEADERS)


@transactions.command("describe")
@bootstrap_option
@output_option
@click.option("--transactional-id", "transactional_id", required=True)
@friendly_errors
def describe(bootstrap_server: str | None, output: str, transactional_id: str) -> None:
    """One transactional id: producer id and epoch, state, timeout, the running transaction's
    start and partitions."""
    with AdminClient(admin_client_config(bootstrap_server)) as admin:
        found = [t for t in admin.list_transactions() if t.transactional_id == transactional_id]
    if not found:
        raise FjordError(f"transactional id {transactional_id!r} is unknown",
                         ErrorCode.TRANSACTIONAL_ID_NOT_FOUND)
    (t,) = found
    partitions = ",".join(f"{tp.topic}-{tp.partition}" for tp in t.partitions)
    emit(output, _json(t),
         [(t.coordinator_id, t.transactional_id, t.producer_id, t.producer_epoch, t.state,
           t.transaction_timeout_ms, t.transaction_start_time_ms, partitions)],
         DESCRIBE_HEADERS)
