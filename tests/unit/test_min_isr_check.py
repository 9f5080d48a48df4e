"""min.insync.replicas may not exceed the replication factor (issue 13): the pure check."""

from __future__ import annotations

import pytest

from fjord.cluster.topic_config import check_min_insync_replicas
from fjord.errors import ConfigError, ErrorCode


def test_topic_override_above_rf_is_refused_naming_the_key() -> None:
    with pytest.raises(ConfigError) as info:
        check_min_insync_replicas("orders", 2, {"min.insync.replicas": "3"}, {})
    assert info.value.code is ErrorCode.INVALID_CONFIG
    assert str(info.value).startswith("min.insync.replicas: 3 (the topic's)")
    assert "replication factor 2 of topic 'orders'" in str(info.value)


def test_cluster_default_counts_too_and_equal_is_fine() -> None:
    with pytest.raises(ConfigError, match=r"2 \(the cluster default\)"):
        check_min_insync_replicas("orders", 1, {}, {"min.insync.replicas": "2"})
    check_min_insync_replicas("orders", 2, {}, {"min.insync.replicas": "2"})
    check_min_insync_replicas("orders", 1, {}, {})  # built-in default 1


def test_internal_topics_are_not_checked() -> None:
    # __consumer_offsets follows the live broker count; a cluster-wide min.insync.replicas
    # must not keep it from being created on a small cluster.
    check_min_insync_replicas("__consumer_offsets", 1, {}, {"min.insync.replicas": "2"})
