"""Fjord as a Spark data source: ``spark.readStream.format("fjord")``, ``df.write.format("fjord")``.

One line makes the format available in a session: ``fjord_spark.register(spark)``; or build a
session with :func:`create_session`, which also checks Java and points Spark's Python workers
at this interpreter. Options and schema follow Spark's Kafka source (docs/spark.md).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING

from fjord_spark.errors import DataLossError, JavaNotFoundError
from fjord_spark.java import check_java
from fjord_spark.source import FjordDataSource

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = [
    "DataLossError",
    "FjordDataSource",
    "JavaNotFoundError",
    "check_java",
    "create_session",
    "register",
]


def register(spark: SparkSession) -> None:
    """Make ``format("fjord")`` available in ``spark``."""
    spark.dataSource.register(FjordDataSource)


def create_session(
    app_name: str = "fjord", master: str | None = None, conf: Mapping[str, str] | None = None
) -> SparkSession:
    """A SparkSession with the ``fjord`` format registered. Checks Java first (a clear
    :class:`JavaNotFoundError` instead of a JVM start failure) and makes Spark's Python
    workers run this interpreter (``PYSPARK_PYTHON``, unless already set), so they import the
    same fjord and fjord_spark."""
    from pyspark.sql import SparkSession

    check_java()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    builder = SparkSession.builder.appName(app_name)
    if master is not None:
        builder = builder.master(master)
    for key, value in (conf or {}).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    register(spark)
    return spark
