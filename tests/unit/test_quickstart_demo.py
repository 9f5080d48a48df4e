"""The pure part of the quickstart scenario (fjord.demo.orders): documents, checks, summary."""

from __future__ import annotations

import random
from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fjord.demo.orders import (
    ScenarioReport,
    StageStats,
    decode,
    encode,
    make_order,
    next_steps,
    order_key,
    render_summary,
    shipment_for,
    verify,
)
from fjord.errors import InvalidRecordError


def _orders(count: int) -> dict[bytes, int]:
    return {order_key(n): n % 6 for n in range(1, count + 1)}


def _shipments(orders: dict[bytes, int]) -> list[tuple[bytes | None, bytes | None, int]]:
    out: list[tuple[bytes | None, bytes | None, int]] = []
    for offset, (key, partition) in enumerate(orders.items()):
        order = make_order(int(key.decode().removeprefix("order-")), random.Random(offset))
        out.append((key, encode(shipment_for(order, partition, offset)), partition))
    return out


@given(number=st.integers(min_value=1, max_value=10**7), seed=st.integers(0, 2**32))
def test_orders_are_valid_json_and_ship_once(number: int, seed: int) -> None:
    order = make_order(number, random.Random(seed))
    assert decode(encode(order), "order") == order
    assert order["order_id"].encode() == order_key(number)
    assert 1 <= len(order["items"]) <= 3
    assert len({item["sku"] for item in order["items"]}) == len(order["items"])
    shipment = shipment_for(order, 4, 17)
    assert shipment["order_id"] == order["order_id"]
    assert shipment["units"] == sum(item["qty"] for item in order["items"])
    assert (shipment["order_partition"], shipment["order_offset"]) == (4, 17)
    assert shipment_for(order, 4, 17) == shipment  # deterministic: a retry gives the same bytes


def test_same_seed_same_orders() -> None:
    first = [encode(make_order(n, random.Random(7))) for n in range(50)]
    assert first == [encode(make_order(n, random.Random(7))) for n in range(50)]


@pytest.mark.parametrize(
    ("value", "message"),
    [(None, "no value"), (b"\xff", "not JSON"), (b"{oops", "not JSON"), (b"[1]", "not an object")],
)
def test_bad_values_are_typed_errors(value: bytes | None, message: str) -> None:
    with pytest.raises(InvalidRecordError, match=message):
        decode(value, "order 0/0")


def test_malformed_order_is_a_typed_error() -> None:
    with pytest.raises(InvalidRecordError, match="malformed"):
        shipment_for({"order_id": "order-1"}, 0, 0)
    with pytest.raises(InvalidRecordError, match="malformed"):
        shipment_for({"order_id": "order-1", "items": [{"qty": "many"}]}, 0, 0)


def test_verify_accepts_one_shipment_per_order() -> None:
    orders = _orders(30)
    result = verify(orders, _shipments(orders))
    assert result.ok, result.describe()
    assert result.describe() == "every one of 30 orders got exactly one shipment"


def test_verify_names_every_kind_of_problem() -> None:
    orders = _orders(10)
    shipments = _shipments(orders)
    missing_key = shipments[0][0]
    shipments = shipments[1:]  # order 1 lost
    shipments.append(shipments[0])  # order 2 shipped twice
    shipments.append((b"order-99999999", b"{}", 0))  # a shipment for no order
    key3, _, partition3 = shipments[1]
    shipments[1] = (key3, encode({"order_id": "order-00000042"}), partition3)  # wrong id
    key4, value4, partition4 = shipments[2]
    shipments[2] = (key4, value4, (partition4 + 1) % 6)  # wrong partition
    shipments.append((None, b"{}", 0))
    result = verify(orders, shipments)
    assert not result.ok
    assert missing_key is not None and result.missing == [missing_key.decode()]
    assert result.duplicated == ["order-00000002"]
    assert sorted(result.unexpected) == ["<no key>", "order-99999999"]
    assert result.mismatched == ["order-00000003"]
    assert result.misplaced == ["order-00000004"]
    text = result.describe()
    for word in ("1 missing", "1 duplicated", "2 unexpected", "1 mismatched", "1 misplaced"):
        assert word in text
    assert verify(orders, shipments, check_placement=False).misplaced == []


def test_counts_must_match_even_without_named_problems() -> None:
    orders = _orders(3)
    assert not verify(orders, []).ok
    assert verify({}, []).ok


def test_summary_lists_partitions_stages_and_verdict() -> None:
    orders = _orders(12)
    written = StageStats("order service: write orders", 12, 0.5, Counter(orders.values()))
    read = StageStats("verify: read shipments", 12, 0.25, Counter(orders.values()))
    report = ScenarioReport(
        orders_topic="orders",
        shipments_topic="shipments",
        partitions=6,
        replication_factor=3,
        stages=[written, read],
        verification=verify(orders, _shipments(orders)),
        elapsed_s=1.5,
    )
    text = render_summary(report)
    lines = text.splitlines()
    assert lines[0].split() == ["partition", "orders", "shipments"]
    assert [line.split() for line in lines[2:9]] == [[str(p), "2", "2"] for p in range(6)] + [
        ["total", "12", "12"]
    ]
    assert "24" in text  # 12 records in 0.5 s
    assert "48" in text  # 12 records in 0.25 s
    assert "6 partitions, replication factor 3" in text
    assert "verification OK" in text
    assert "elapsed: 1.50 s" in text


def test_next_steps_name_the_data_dir_only_when_not_default() -> None:
    default = next_steps("127.0.0.1:1,127.0.0.1:2")
    assert "fjord local down\n" in default + "\n"
    assert "--bootstrap-server" not in default
    custom = next_steps("127.0.0.1:1", "/tmp/x")
    assert "fjord local status --data-dir /tmp/x" in custom
    assert "fjord topics list --bootstrap-server 127.0.0.1:1" in custom
    assert "--topic shipments --from-beginning --max-messages 5" in custom
