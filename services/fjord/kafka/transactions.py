"""ListTransactions on a door that coordinates no transactions (a broker): an empty list.
Kafka's admin clients ask every node (kafka-python first checks that the node it talks to
advertises the API); the coordinators' doors answer with their transactional ids
(:mod:`fjord.coordinator.kafka_transactions`)."""

from __future__ import annotations

from typing import Any

from kafka.protocol.admin.transactions import ListTransactionsResponse

from fjord.kafka.dispatch import RequestContext

#: ListTransactions versions served (v2's transactional id pattern is not).
LIST_TRANSACTIONS_VERSIONS = (0, 1)


async def list_no_transactions(request: Any, ctx: RequestContext) -> Any:
    return ListTransactionsResponse[ctx.api_version](
        throttle_time_ms=0, error_code=0, unknown_state_filters=[], transaction_states=[]
    )
