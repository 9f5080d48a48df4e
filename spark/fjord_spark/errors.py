"""The Spark data source's own typed errors (both are fjord.errors.FjordError subclasses)."""

from __future__ import annotations

from fjord.errors import ConfigError, OffsetOutOfRangeError


class DataLossError(OffsetOutOfRangeError):
    """Records a query needs are gone (deleted by retention, or the partition was recreated or
    removed) and ``failOnDataLoss`` is true. Spark's Kafka source fails in the same cases; set
    ``failOnDataLoss`` to ``false`` to skip what was lost instead."""


class JavaNotFoundError(ConfigError):
    """No Java runtime, or one older than Spark needs (17): install one, e.g.
    ``apt-get install -y openjdk-17-jre-headless``, or point ``JAVA_HOME`` at it."""
