"""docs/configuration.md's tables are what fjord.cluster.config_catalog says (regenerate with
``python -m fjord.tools.config_doc``), and the catalog holds every key any config schema
accepts, once."""

from __future__ import annotations

from fjord.cluster.broker_config import BROKER_ONLY_KEYS, CONTROLLER_ONLY_KEYS, TOPIC_CONFIG_KEYS
from fjord.cluster.config_catalog import CATALOG
from fjord.cluster.dynamic_config import DYNAMIC_BROKER_KEYS, READ_ONLY_BROKER_KEYS
from fjord.tools.config_doc import DOC, render


def test_the_doc_is_generated_from_the_catalog() -> None:
    text = DOC.read_text()
    assert render(text) == text, "docs/configuration.md is stale: python -m fjord.tools.config_doc"


def test_the_catalog_holds_every_accepted_key_once() -> None:
    names = [k.name for k in CATALOG]
    assert len(names) == len(set(names))
    assert set(names) == TOPIC_CONFIG_KEYS | BROKER_ONLY_KEYS | CONTROLLER_ONLY_KEYS
    for key in CATALOG:
        assert (key.update_mode == "read-only") == (key.name in READ_ONLY_BROKER_KEYS)
        assert (key.update_mode != "read-only") == (key.name in DYNAMIC_BROKER_KEYS)
