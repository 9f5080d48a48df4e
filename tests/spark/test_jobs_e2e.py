"""The orders -> shipments job end to end: orders produced to a Fjord topic on the shared local
cluster, the job run with AvailableNow through the ``fjord`` source and sink, shipments and dead
letters read back from their topics; a second run with the same checkpoint (through the job's
command line, ``main()``) processes only the orders that arrived since."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from fjord.client import ConsumerRecord
from fjord_jobs import orders_shipments
from fjord_jobs.common import JobOptions
from fjord_jobs.defaults import REJECT_REASON_HEADER
from tests.helpers.spark import SPARK_WAIT_S, order, read_all, send_orders

pytestmark = pytest.mark.integration


def header(record: ConsumerRecord, name: str) -> str:
    values = [bytes(v or b"").decode() for k, v in record.headers if k == name]
    assert len(values) == 1, record.headers
    return values[0]


# Under a loaded 2-core machine Spark's first streaming queries are slow: a larger bound.
@pytest.mark.timeout(900)
def test_orders_to_shipments_through_fjord_topics(
    spark: Any, bootstrap: str, new_topic: Callable[..., str], tmp_path: Path
) -> None:
    orders, shipments, dead = new_topic(2), new_topic(2), new_topic(1)
    first = [
        order("o-1", "SKU-BOOK", 2),
        order("o-2", "SKU-PHONE"),
        order("o-3", "SKU-CHAIR", 4),
        order("o-4", "SKU-NOT-STOCKED"),
        ("o-5", "{broken json"),
    ]
    send_orders(bootstrap, orders, first)
    checkpoint = tmp_path / "checkpoint"

    query = orders_shipments.start(
        spark,
        JobOptions(bootstrap_servers=bootstrap, checkpoint=str(checkpoint), available_now=True),
        orders_shipments.warehouses_frame(spark),
        orders,
        shipments,
        dead,
    )
    assert query.awaitTermination(SPARK_WAIT_S), "AvailableNow did not finish"
    assert query.exception() is None

    shipped = {
        (r.key or b"").decode(): json.loads(r.value or b"") for r in read_all(bootstrap, shipments)
    }
    assert sorted(shipped) == ["o-1", "o-2", "o-3"]
    assert {k: (s["warehouse"], s["carrier"], s["qty"]) for k, s in shipped.items()} == {
        "o-1": ("WH-NORTH", "DHL", 2),
        "o-2": ("WH-SOUTH", "UPS", 1),
        "o-3": ("WH-WEST", "FEDEX", 4),
    }
    assert all(s["source"]["topic"] == orders for s in shipped.values())
    dead_letters = read_all(bootstrap, dead)
    got_dead = {
        (r.key or b"").decode(): (
            (r.value or b"").decode(),
            header(r, REJECT_REASON_HEADER),
        )
        for r in dead_letters
    }
    assert got_dead == {
        "o-4": (dict(first)["o-4"], "UNKNOWN_SKU"),
        "o-5": ("{broken json", "INVALID_JSON"),
    }

    # New orders arrive; the job runs again from its checkpoint, now through its command line.
    send_orders(bootstrap, orders, [order("o-6", "SKU-DESK"), order("o-7", "SKU-LAMP", 3)])
    exit_code = orders_shipments.main(
        [
            "--bootstrap-servers",
            bootstrap,
            "--checkpoint",
            str(checkpoint),
            "--available-now",
            "--orders-topic",
            orders,
            "--shipments-topic",
            shipments,
            "--dead-letter-topic",
            dead,
        ]
    )
    assert exit_code == 0
    keys = sorted((r.key or b"").decode() for r in read_all(bootstrap, shipments))
    assert keys == ["o-1", "o-2", "o-3", "o-6", "o-7"]  # nothing processed twice
    assert len(read_all(bootstrap, dead)) == 2
