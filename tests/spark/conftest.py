"""Spark test fixtures: ONE SparkSession (``local[2]``) for every Spark test, its workers running
this venv's Python, and a fixture that creates topics on the shared cluster
(``local_cluster``/``bootstrap`` from tests/conftest.py). What test modules import (the wait
bound, ``produce``) is tests/helpers/spark.py's."""

from __future__ import annotations

import os
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from fjord.client import AdminClient, NewTopic

#: pytest timeout of every Spark test. The first test to use ``spark`` also pays for starting
#: the shared cluster and the JVM, minutes on a loaded 2-core machine; and a timeout that
#: interrupts a py4j call leaves the gateway unusable for every later test.
SPARK_TEST_TIMEOUT_S = 900


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents and item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(SPARK_TEST_TIMEOUT_S))


@pytest.fixture(scope="session")
def spark(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    import fjord_spark

    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    session = fjord_spark.create_session(
        "fjord-spark-tests",
        "local[2]",
        {
            "spark.ui.enabled": "false",
            # Python workers start slowly on a loaded 2-core machine (15 s by default).
            "spark.python.authenticate.socketTimeout": "120s",
            "spark.ui.showConsoleProgress": "false",
            "spark.sql.shuffle.partitions": "2",
            "spark.default.parallelism": "2",
            "spark.driver.memory": "1g",
            "spark.sql.warehouse.dir": str(tmp_path_factory.mktemp("spark-warehouse")),
            "spark.driver.extraJavaOptions": "-Dderby.system.home="
            + str(tmp_path_factory.mktemp("derby")),
        },
    )
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


@pytest.fixture(scope="session")
def admin(bootstrap: str) -> Iterator[AdminClient]:
    with AdminClient({"bootstrap.servers": bootstrap}) as client:
        yield client


@pytest.fixture(scope="session")
def new_topic(admin: AdminClient) -> Callable[..., str]:
    """Create a topic with a unique name: ``new_topic(partitions, **config)``."""

    def create(partitions: int = 2, config: dict[str, str] | None = None) -> str:
        name = f"spark-{uuid.uuid4().hex[:10]}"
        admin.create_topics([NewTopic(name, partitions, 1, config or {})])
        return name

    return create
