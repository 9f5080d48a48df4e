"""The pure part of the quickstart scenario: orders, shipments, verification and the summary.

The seeds' first scenario decouples an order service from a shipping service through a log: the
order service writes each order to ``orders`` keyed by its order id; the shipping service reads
``orders`` and writes one shipment per order to ``shipments`` under the same key. Both topics
have the same partition count, so a key's order and shipment land in partitions with the same
number (Kafka's murmur2 partitioner) — the verification checks that too.

Nothing here does I/O: :mod:`fjord.demo.scenario` drives real clients and hands the records to
these functions.
"""

from __future__ import annotations

import json
import random
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from tabulate import tabulate

from fjord.errors import InvalidRecordError

CUSTOMERS = ("ada", "grace", "linus", "margaret", "barbara", "ken", "dennis", "frances")
PRODUCTS = ("kayak", "paddle", "dry-bag", "life-vest", "tent", "stove", "map", "compass")
CARRIERS = ("fjordpost", "nordfrakt", "bergen-express")


def order_id(number: int) -> str:
    return f"order-{number:08d}"


def order_key(number: int) -> bytes:
    """The record key of an order (and of its shipment): the order id."""
    return order_id(number).encode()


def make_order(number: int, rng: random.Random) -> dict[str, Any]:
    """A plausible order: a customer, 1-3 distinct items, a total in cents.

    All choices come from one 64-bit draw of ``rng`` (the same seed gives the same orders);
    generating orders must not cost more than sending them.
    """
    bits = rng.getrandbits(64)
    count = 1 + (bits >> 3) % 3
    first = (bits >> 5) % len(PRODUCTS)
    quantities = [1 + (bits >> (8 + 2 * i)) % 3 for i in range(count)]
    items = [
        {"sku": PRODUCTS[(first + i) % len(PRODUCTS)], "qty": qty}
        for i, qty in enumerate(quantities)
    ]
    unit_cents = 500 + (bits >> 16) % 49_500
    return {
        "order_id": order_id(number),
        "customer": CUSTOMERS[bits % len(CUSTOMERS)],
        "items": items,
        "total_cents": unit_cents * sum(quantities),
    }


def encode(document: Mapping[str, Any]) -> bytes:
    """Compact, key-sorted JSON: the same document always gives the same bytes."""
    return json.dumps(document, sort_keys=True, separators=(",", ":")).encode()


def decode(value: bytes | None, what: str) -> dict[str, Any]:
    """Parse a JSON object record value; anything else is an :class:`InvalidRecordError`."""
    if value is None:
        raise InvalidRecordError(f"{what}: the record has no value")
    try:
        document = json.loads(value)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InvalidRecordError(f"{what}: the value is not JSON ({exc})") from exc
    if not isinstance(document, dict):
        raise InvalidRecordError(f"{what}: the value is JSON but not an object")
    return document


def shipment_for(order: Mapping[str, Any], partition: int, offset: int) -> dict[str, Any]:
    """The one shipment the shipping service creates for ``order`` read at partition/offset.

    Raises :class:`InvalidRecordError` when the order lacks an id or its items.
    """
    try:
        the_order_id = str(order["order_id"])
        items = order["items"]
        units = sum(int(item["qty"]) for item in items)
    except (KeyError, TypeError, ValueError) as exc:
        raise InvalidRecordError(f"order at {partition}/{offset} is malformed: {exc}") from exc
    return {
        "shipment_id": "ship-" + the_order_id.removeprefix("order-"),
        "order_id": the_order_id,
        "customer": order.get("customer"),
        "units": units,
        "carrier": CARRIERS[sum(the_order_id.encode()) % len(CARRIERS)],
        "order_partition": partition,
        "order_offset": offset,
    }


@dataclass
class Verification:
    """Outcome of checking that every order got exactly one matching shipment.

    Invariant: ``ok`` is true exactly when every list is empty and the counts are equal.
    """

    orders: int
    shipments: int
    missing: list[str] = field(default_factory=list)  # orders without a shipment
    duplicated: list[str] = field(default_factory=list)  # orders with more than one
    unexpected: list[str] = field(default_factory=list)  # shipments for no known order
    mismatched: list[str] = field(default_factory=list)  # value's order_id differs from key
    misplaced: list[str] = field(default_factory=list)  # not in the order's partition number

    @property
    def ok(self) -> bool:
        problems = (self.missing, self.duplicated, self.unexpected, self.mismatched, self.misplaced)
        return self.orders == self.shipments and not any(problems)

    def describe(self) -> str:
        if self.ok:
            return f"every one of {self.orders} orders got exactly one shipment"
        parts = [f"{self.orders} orders, {self.shipments} shipments"]
        for name in ("missing", "duplicated", "unexpected", "mismatched", "misplaced"):
            keys: list[str] = getattr(self, name)
            if keys:
                parts.append(f"{len(keys)} {name} (e.g. {', '.join(sorted(keys)[:3])})")
        return "; ".join(parts)


def verify(
    orders: Mapping[bytes, int],
    shipments: Iterable[tuple[bytes | None, bytes | None, int]],
    check_placement: bool = True,
) -> Verification:
    """Check shipments ``(key, value, partition)`` against orders ``{key: partition}``.

    ``check_placement``: also require each shipment in the partition number of its order
    (true when both topics have the same partition count).
    """
    seen: Counter[bytes] = Counter()
    result = Verification(orders=len(orders), shipments=0)
    for key, value, partition in shipments:
        result.shipments += 1
        label = key.decode(errors="replace") if key is not None else "<no key>"
        if key is None or key not in orders:
            result.unexpected.append(label)
            continue
        seen[key] += 1
        try:
            shipment = decode(value, f"shipment {label}")
        except InvalidRecordError:
            result.mismatched.append(label)
            continue
        if shipment.get("order_id") != label:
            result.mismatched.append(label)
        if check_placement and partition != orders[key]:
            result.misplaced.append(label)
    result.missing = [k.decode() for k in orders if seen[k] == 0]
    result.duplicated = [k.decode() for k, n in seen.items() if n > 1]
    return result


@dataclass
class StageStats:
    """One stage of the scenario: how many records, how long, and per partition.

    Invariant (kept by the stages that fill it): ``sum(per_partition.values()) == records``.
    """

    name: str
    records: int = 0
    seconds: float = 0.0
    per_partition: Counter[int] = field(default_factory=Counter)

    @property
    def records_per_s(self) -> float:
        return self.records / self.seconds if self.seconds > 0 else 0.0


@dataclass
class ScenarioReport:
    """What one run of the scenario did: the topics, its stages in order, the verification."""

    orders_topic: str
    shipments_topic: str
    partitions: int
    replication_factor: int
    stages: list[StageStats]
    verification: Verification
    elapsed_s: float


def render_summary(report: ScenarioReport) -> str:
    """The table the quickstart prints: per-partition counts, per-stage throughput, verdict."""
    by_name = {stage.name: stage for stage in report.stages}
    written = by_name.get("order service: write orders", StageStats(""))
    shipped = by_name.get("verify: read shipments", StageStats(""))
    partition_rows: list[list[int | str]] = [
        [p, written.per_partition.get(p, 0), shipped.per_partition.get(p, 0)]
        for p in range(report.partitions)
    ]
    partition_rows.append(["total", written.records, shipped.records])
    stage_rows = [
        [stage.name, stage.records, f"{stage.seconds:.2f}", f"{stage.records_per_s:,.0f}"]
        for stage in report.stages
    ]
    verdict = "OK" if report.verification.ok else "FAILED"
    return "\n".join(
        [
            tabulate(
                partition_rows,
                headers=["partition", report.orders_topic, report.shipments_topic],
                tablefmt="simple",
            ),
            "",
            tabulate(
                stage_rows,
                headers=["stage", "records", "seconds", "records/s"],
                tablefmt="simple",
                disable_numparse=True,
            ),
            "",
            f"topics {report.orders_topic}, {report.shipments_topic}: {report.partitions} "
            f"partitions, replication factor {report.replication_factor}",
            f"verification {verdict}: {report.verification.describe()}",
            f"elapsed: {report.elapsed_s:.2f} s",
        ]
    )


def next_steps(
    bootstrap: str, data_dir: str | None = None, shipments_topic: str = "shipments"
) -> str:
    """How to use the running cluster from another terminal.

    ``data_dir`` is None for the default data directory, which the ``fjord`` commands find by
    themselves when run from the same directory; otherwise the commands name it.
    """
    server = "" if data_dir is None else f" --bootstrap-server {bootstrap}"
    where = "" if data_dir is None else f" --data-dir {data_dir}"
    return "\n".join(
        [
            f"The cluster keeps running; bootstrap servers: {bootstrap}",
            "From another terminal, in this directory or one below it:",
            f"  fjord topics list{server}",
            f"  fjord consume{server} --topic {shipments_topic} --from-beginning --max-messages 5",
            f"  fjord local status{where}",
            f"  fjord local down{where}",
        ]
    )
