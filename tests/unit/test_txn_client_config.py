"""A transactional producer's configuration: transactional.id needs idempotence."""

from __future__ import annotations

import pytest

from fjord.config import producer_config
from fjord.errors import ConfigError


def test_transactional_id_turns_idempotence_on_and_refuses_it_off() -> None:
    config = producer_config({"bootstrap.servers": "h:1", "transactional.id": "t"})
    assert config["enable.idempotence"] and config["transaction.timeout.ms"] == 60000
    with pytest.raises(ConfigError, match=r"enable\.idempotence"):
        producer_config(
            {"bootstrap.servers": "h:1", "transactional.id": "t", "enable.idempotence": False}
        )
    with pytest.raises(ConfigError, match="acks"):
        producer_config({"bootstrap.servers": "h:1", "transactional.id": "t", "acks": 1})
    with pytest.raises(ConfigError, match=r"transaction\.timeout\.ms"):
        producer_config(
            {"bootstrap.servers": "h:1", "transactional.id": "t", "transaction.timeout.ms": 0}
        )
