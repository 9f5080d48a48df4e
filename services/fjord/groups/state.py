"""The states of a consumer group, under the names Kafka's DescribeGroups/ListGroups report.

The coordinator's :class:`~fjord.coordinator.group.GroupStateMachine` moves between them; the
admin client and ``fjord groups`` parse and print them.
"""

from __future__ import annotations

from enum import Enum


class GroupState(Enum):
    EMPTY = "Empty"
    PREPARING_REBALANCE = "PreparingRebalance"
    COMPLETING_REBALANCE = "CompletingRebalance"
    STABLE = "Stable"
    DEAD = "Dead"
