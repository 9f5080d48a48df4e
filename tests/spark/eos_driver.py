"""A Spark driver for the exactly-once proof (tests/spark/test_spark_exactly_once.py): runs the
orders -> shipments job (``orders_shipments.start``, AvailableNow) in its own process so the
test can SIGKILL it mid-batch and run it again from the same checkpoint.

The only fault injected: the ``fjord`` format is registered with a sink whose write tasks, the
first time one meets the order ``hang_order`` (no ``flag`` file yet), send the rows before it,
create ``flag`` and sleep until the process is killed: that task keeps its transaction open
with records sent while the other tasks of the batch commit. Run with the flag present, the
sink is the real exactly-once sink unchanged.

Usage: python -m tests.spark.eos_driver BOOTSTRAP ORDERS SHIPMENTS DEAD CHECKPOINT FLAG ORDER
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterator, Sequence

import pyarrow as pa
from pyspark.sql.datasource import DataSourceStreamArrowWriter, WriterCommitMessage
from pyspark.sql.types import StructType

from fjord_spark.source import FjordDataSource, FjordExactlyOnceStreamWriter

#: Set by main() before the query starts; travels to the write tasks inside the writer.
HANG: tuple[str, str] = ("", "")


def hang_once(
    batches: Iterator[pa.RecordBatch], order_id: str, flag: str
) -> Iterator[pa.RecordBatch]:
    """``batches`` unchanged, except that the first time (no ``flag`` yet) a batch holds the row
    keyed ``order_id``, the rows before it are passed on and then this sleeps until killed."""
    for batch in batches:
        keys = [bytes(k).decode() if k is not None else None for k in batch["key"].to_pylist()]
        if order_id in keys and not os.path.exists(flag):
            before = keys.index(order_id)
            if before:
                yield batch.slice(0, before)
            with open(flag, "w"):
                pass
            time.sleep(3600)  # the producer's I/O thread sends what was yielded meanwhile
        yield batch


class HangingWriter(FjordExactlyOnceStreamWriter):
    def __init__(self, writer: FjordExactlyOnceStreamWriter, order_id: str, flag: str) -> None:
        super().__init__(writer.options)
        self.order_id, self.flag = order_id, flag

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:
        return super().write(hang_once(iterator, self.order_id, self.flag))


class FaultyFjord(FjordDataSource):
    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamArrowWriter:
        writer = super().streamWriter(schema, overwrite)
        assert isinstance(writer, FjordExactlyOnceStreamWriter), "the job must write exactly once"
        return HangingWriter(writer, *HANG)


def main(argv: Sequence[str]) -> int:
    global HANG
    bootstrap, orders, shipments, dead, checkpoint, flag, hang_order = argv
    HANG = (hang_order, flag)
    import fjord_spark
    from fjord_jobs import orders_shipments
    from fjord_jobs.common import JobOptions

    spark = fjord_spark.create_session(
        "fjord-eos-driver",
        "local[2]",
        {
            "spark.ui.enabled": "false",
            "spark.ui.showConsoleProgress": "false",
            "spark.python.authenticate.socketTimeout": "120s",
            "spark.sql.shuffle.partitions": "2",
            "spark.sql.session.timeZone": "UTC",
        },
    )
    spark.sparkContext.setLogLevel("ERROR")
    spark.dataSource.register(FaultyFjord)  # replaces the real one's registration
    options = JobOptions(bootstrap_servers=bootstrap, checkpoint=checkpoint, available_now=True)
    query = orders_shipments.start(
        spark, options, orders_shipments.warehouses_frame(spark), orders, shipments, dead
    )
    query.awaitTermination()
    failed = query.exception()
    spark.stop()
    return 0 if failed is None else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
