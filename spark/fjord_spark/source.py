"""The ``fjord`` Spark data source: batch and streaming reader, batch and streaming writer.

This module is the thin shell: it translates between Spark's Python Data Source API and
``fjord.client``; option parsing, offset arithmetic and Arrow conversion live in the pure
modules next to it. Where the code runs:

- ``FjordDataSource`` and the readers/writers are created on the driver (in Python processes
  Spark starts for planning and for a streaming query's offsets) and pickled to executors;
  they hold no open clients when pickled (clients are created lazily and dropped by
  ``__getstate__``).
- ``read()`` and ``write()`` run in tasks. Everything a read task needs travels inside its
  :class:`FjordInputPartition`.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceReader,
    DataSourceStreamArrowWriter,
    DataSourceStreamReader,
    InputPartition,
    WriterCommitMessage,
)
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from fjord.client import (
    AdminClient,
    Consumer,
    OffsetAndMetadata,
    Producer,
    RecordFuture,
    RecordsFuture,
    TopicPartition,
)
from fjord.errors import (
    ConfigError,
    ErrorCode,
    FjordError,
    KafkaTimeoutError,
    OffsetOutOfRangeError,
    UnknownTopicOrPartitionError,
)
from fjord_spark import defaults
from fjord_spark.arrow import (
    TIMESTAMP_TYPES,
    ArrowColumns,
    arrow_schema,
    batch_to_groups,
    batch_to_records,
    check_writer_schema,
    reader_schema,
)
from fjord_spark.errors import DataLossError
from fjord_spark.offsets import (
    OffsetRange,
    Offsets,
    TriggerDelay,
    available_records,
    limit_offsets,
    offsets_from_json,
    offsets_to_json,
    plan_ranges,
    resolve_offsets,
    split_ranges,
)
from fjord_spark.options import (
    EARLIEST,
    LATEST,
    ReaderOptions,
    TopicSelection,
    WriterOptions,
    parse_reader_options,
    parse_writer_options,
)

log = logging.getLogger(__name__)


class FjordDataSource(DataSource):
    """``spark.read[Stream].format("fjord")`` and ``df.write[Stream].format("fjord")``.

    Invariant: options are validated when a reader or writer is created, so a bad option
    fails the query at analysis time with a :class:`fjord.errors.ConfigError` naming it.
    """

    @classmethod
    def name(cls) -> str:
        return defaults.FORMAT_NAME

    def schema(self) -> StructType:
        include = str(self.options.get("includeHeaders", "false")).strip().lower() == "true"
        return reader_schema(include)

    def reader(self, schema: StructType) -> DataSourceReader:
        return FjordBatchReader(parse_reader_options(self.options, streaming=False), schema)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return FjordStreamReader(parse_reader_options(self.options, streaming=True), schema)

    def writer(self, schema: StructType, overwrite: bool) -> FjordBatchWriter:
        if overwrite:
            raise ConfigError(
                "save mode Overwrite is not allowed for fjord (a log is append-only): "
                "use append or errorifexists"
            )
        options = parse_writer_options(self.options)
        check_writer_schema(schema, options.topic)
        if options.exactly_once:
            raise ConfigError(
                "exactlyOnce applies to streaming writes (df.writeStream): a batch write has no "
                "query id and batch id to fence and mark its transactions with"
            )
        return FjordBatchWriter(options)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamArrowWriter:
        options = parse_writer_options(self.options)
        check_writer_schema(schema, options.topic)
        if options.exactly_once:
            return FjordExactlyOnceStreamWriter(options)
        return FjordStreamWriter(options)


# -- reading ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class FjordInputPartition(InputPartition):
    """One read task: records ``[from_offset, until_offset)`` of one partition, plus the
    consumer configuration and read settings the task needs (it asks the driver nothing)."""

    topic: str
    partition: int
    from_offset: int
    until_offset: int
    timestamp_type: int
    include_headers: bool
    fail_on_data_loss: bool
    poll_timeout_ms: int
    consumer_config: Mapping[str, Any]


def read_partition(task: FjordInputPartition, schema: pa.Schema) -> Iterator[pa.RecordBatch]:
    """Arrow batches of exactly the records ``[from_offset, until_offset)`` of the task's
    partition (fewer when records were compacted away, or deleted and ``failOnDataLoss`` is
    false). Raises :class:`DataLossError` when the range was deleted meanwhile and
    ``failOnDataLoss`` is true, :class:`KafkaTimeoutError` when records known to exist do not
    arrive within ``pollTimeoutMs``."""
    until = task.until_offset
    if task.from_offset >= until:
        return
    tp = TopicPartition(task.topic, task.partition)
    timeout_s = task.poll_timeout_ms / 1000
    consumer = Consumer(task.consumer_config)
    # Records go straight from the fetched batches into Arrow columns (ArrowColumns).
    columns = ArrowColumns(schema, task.topic, task.partition, task.timestamp_type)
    try:
        consumer.assign([tp])
        consumer.seek(tp, task.from_offset)
        position = task.from_offset
        deadline = time.monotonic() + timeout_s
        while position < until:
            try:
                added = consumer.poll_into(
                    columns, timeout=max(0.0, min(deadline - time.monotonic(), 1.0))
                )
            except OffsetOutOfRangeError as exc:
                position = _after_out_of_range(consumer, tp, position, task, exc)
                deadline = time.monotonic() + timeout_s
                continue
            # Under read_committed a poll may move the position past aborted records and
            # transaction markers without returning any: progress all the same.
            moved = consumer.position(tp) > position
            if added:
                deadline = time.monotonic() + timeout_s
                if (
                    columns.rows >= defaults.ARROW_BATCH_ROWS
                    or columns.data_bytes >= defaults.ARROW_BATCH_BYTES
                ):
                    batch = columns.take(until)
                    if batch is not None:
                        yield batch
            elif moved:
                deadline = time.monotonic() + timeout_s
            elif time.monotonic() >= deadline:
                raise KafkaTimeoutError(
                    f"no records of {tp.topic}-{tp.partition} arrived within pollTimeoutMs="
                    f"{task.poll_timeout_ms} although offsets {position}..{until - 1} exist "
                    "(is its leader up?)"
                )
            position = max(position, consumer.position(tp))
        batch = columns.take(until)
        if batch is not None:
            yield batch
    finally:
        consumer.close()


def _unknown_topic(topic: str) -> UnknownTopicOrPartitionError:
    return UnknownTopicOrPartitionError(
        f"topic {topic!r} does not exist (create it first, e.g. "
        f"`fjord topics create --topic {topic}`)"
    )


def _after_out_of_range(
    consumer: Consumer,
    tp: TopicPartition,
    position: int,
    task: FjordInputPartition,
    error: OffsetOutOfRangeError,
) -> int:
    """The broker answered OFFSET_OUT_OF_RANGE for ``position``: records were deleted while
    the task ran (the log now starts past it) or the partition went back (it now ends at or
    before it: recreated or truncated). Fail with :class:`DataLossError`, or with
    ``failOnDataLoss=false`` return where to go on (the new log start, or the task's end when
    the rest is gone), seeking there. An offset the log still holds re-raises ``error``: that is
    a fault to report, not to wait out."""
    earliest = consumer.beginning_offsets([tp])[tp]
    latest = consumer.end_offsets([tp])[tp]
    if earliest > position:
        what = f"the log now starts at {earliest}"
        start = min(earliest, task.until_offset)
    elif latest <= position:
        what = f"the log now ends at {latest} (the partition went back)"
        start = task.until_offset
    else:
        raise error
    message = f"cannot read {tp.topic}-{tp.partition} from offset {position}: {what}"
    if task.fail_on_data_loss:
        raise DataLossError(
            f"{message}. Some data may have been lost because it is no longer available in "
            "Fjord (deleted by retention, or the topic was recreated). Set the option "
            'failOnDataLoss to "false" to skip it.'
        )
    log.warning("%s; skipping the lost records because failOnDataLoss is false", message)
    if start < task.until_offset:
        consumer.seek(tp, start)
    return start


class ClusterView:
    """The driver's window on the cluster: which partitions a query reads and their offsets.

    Invariant: holds at most one AdminClient and one Consumer, created on first use and closed
    by :meth:`close`; never pickled with them (readers travel to executors)."""

    def __init__(self, options: ReaderOptions) -> None:
        self.options = options
        self._admin: AdminClient | None = None
        self._consumer: Consumer | None = None
        self._timestamp_types: dict[str, int] = {}

    def __getstate__(self) -> dict[str, Any]:
        return {"options": self.options}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["options"])  # type: ignore[misc]

    @property
    def admin(self) -> AdminClient:
        if self._admin is None:
            self._admin = AdminClient(self.options.admin_config())
        return self._admin

    @property
    def consumer(self) -> Consumer:
        if self._consumer is None:
            self._consumer = Consumer(self.options.driver_consumer_config())
        return self._consumer

    def partitions(self) -> list[TopicPartition]:
        """The partitions the query reads now (a pattern matches topics created later too)."""
        selection: TopicSelection = self.options.selection
        if selection.pattern is not None:
            return sorted(
                TopicPartition(t.name, p.partition)
                for t in self.admin.describe_topics(None)
                if not t.internal and selection.matches(t.name)
                for p in t.partitions
            )
        topics = list(selection.topics) or list(
            dict.fromkeys(tp.topic for tp in selection.assigned)
        )
        existing = {t.name: {p.partition for p in t.partitions} for t in self._describe(topics)}
        if not selection.assigned:
            return sorted(TopicPartition(t, p) for t, ps in existing.items() for p in ps)
        for tp in selection.assigned:
            if tp.partition not in existing[tp.topic]:
                raise UnknownTopicOrPartitionError(
                    f"partition {tp.topic}-{tp.partition} does not exist (topic {tp.topic!r} has "
                    f"{len(existing[tp.topic])} partitions)"
                )
        return sorted(selection.assigned)

    def _describe(self, topics: list[str]) -> list[Any]:
        """The named topics' descriptions, in one Metadata request (the admin client spaces its
        metadata refreshes by ``METADATA_REFRESH_BACKOFF_MS``: one request per topic waited
        that long for each topic after the first). When a topic does not exist, each is asked
        alone, to name it."""
        try:
            return self.admin.describe_topics(topics)
        except FjordError as exc:
            if exc.code is not ErrorCode.UNKNOWN_TOPIC_OR_PARTITION:
                raise
            if len(topics) == 1:
                raise _unknown_topic(topics[0]) from exc
        for topic in topics:
            try:
                self.admin.describe_topics([topic])
            except FjordError as exc:
                if exc.code is ErrorCode.UNKNOWN_TOPIC_OR_PARTITION:
                    raise _unknown_topic(topic) from exc
                raise
        return self.admin.describe_topics(topics)  # each exists now: created meanwhile

    def earliest(self, tps: Sequence[TopicPartition]) -> Offsets:
        return dict(self.consumer.beginning_offsets(tps)) if tps else {}

    def latest(self, tps: Sequence[TopicPartition]) -> Offsets:
        return dict(self.consumer.end_offsets(tps)) if tps else {}

    def at_timestamps(
        self, stamps: Mapping[TopicPartition, int], option: str, strategy: str
    ) -> Offsets:
        """The first offset at or after each partition's timestamp; where there is none, the
        end (``strategy`` "latest") or an error naming ``option`` ("error")."""
        if not stamps:
            return {}
        found = self.consumer.offsets_for_times(dict(stamps))
        missing = [tp for tp, hit in found.items() if hit is None]
        if missing and strategy == "error":
            names = ", ".join(f"{tp.topic}-{tp.partition} ({stamps[tp]})" for tp in missing)
            raise OffsetOutOfRangeError(
                f"no record at or after the timestamp of option {option} in {names}; set "
                "startingOffsetsByTimestampStrategy to latest to start at the end there"
            )
        latest = self.latest(missing)
        return {tp: (hit.offset if hit is not None else latest[tp]) for tp, hit in found.items()}

    @staticmethod
    def _per_partition(
        stamps: Mapping[TopicPartition, int], tps: list[TopicPartition], option: str
    ) -> dict[TopicPartition, int]:
        """Spark's rule for ``*OffsetsByTimestamp``: the JSON names exactly the partitions the
        query reads."""
        extra = sorted(set(stamps) - set(tps))
        absent = sorted(set(tps) - set(stamps))
        if extra or absent:

            def show(group: list[TopicPartition]) -> str:
                return ", ".join(f"{tp.topic}-{tp.partition}" for tp in group) or "none"

            raise ConfigError(
                f"option {option} must name exactly the partitions the query reads: missing "
                f"{show(absent)}; not read by this query {show(extra)}"
            )
        return {tp: stamps[tp] for tp in tps}

    def starting_offsets(self, tps: list[TopicPartition]) -> Offsets:
        """startingTimestamp, else startingOffsetsByTimestamp, else startingOffsets (Spark's
        precedence)."""
        options = self.options
        if options.starting_timestamp is not None:
            stamps = {tp: options.starting_timestamp for tp in tps}
            return self.at_timestamps(stamps, "startingTimestamp", options.timestamp_strategy)
        if options.starting_by_timestamp is not None:
            stamps = self._per_partition(
                options.starting_by_timestamp, tps, "startingOffsetsByTimestamp"
            )
            return self.at_timestamps(
                stamps, "startingOffsetsByTimestamp", options.timestamp_strategy
            )
        spec = options.starting
        # Only the ListOffsets requests the spec needs (resolve_offsets reads no other edge).
        specific = set(spec.specific.values())
        earliest = self.earliest(tps) if spec.strategy == "earliest" or EARLIEST in specific else {}
        latest = self.latest(tps) if spec.strategy == "latest" or LATEST in specific else {}
        return resolve_offsets(spec, tps, earliest, latest, "startingOffsets")

    def ending_offsets(self, tps: list[TopicPartition], earliest: Offsets) -> Offsets:
        """endingTimestamp, else endingOffsetsByTimestamp, else endingOffsets; a partition
        without a record at or after the timestamp ends at its latest offset (Spark's rule)."""
        options = self.options
        if options.ending_timestamp is not None:
            stamps = {tp: options.ending_timestamp for tp in tps}
            return self.at_timestamps(stamps, "endingTimestamp", "latest")
        if options.ending_by_timestamp is not None:
            stamps = self._per_partition(
                options.ending_by_timestamp, tps, "endingOffsetsByTimestamp"
            )
            return self.at_timestamps(stamps, "endingOffsetsByTimestamp", "latest")
        assert options.ending is not None
        return resolve_offsets(options.ending, tps, earliest, self.latest(tps), "endingOffsets")

    def plan(
        self, start: Mapping[TopicPartition, int], end: Mapping[TopicPartition, int]
    ) -> list[FjordInputPartition]:
        """The tasks reading ``[start, end)``: one range per partition, split by
        ``minPartitions`` / ``maxRecordsPerPartition`` (Spark's offset range calculator)."""
        log_start = self.earliest(sorted(end))
        ranges = plan_ranges(start, end, log_start, self.options.fail_on_data_loss)
        options = self.options
        return self.tasks(
            split_ranges(ranges, options.min_partitions, options.max_records_per_partition)
        )

    def timestamp_type(self, topic: str) -> int:
        """0 (CreateTime) or 1 (LogAppendTime): the topic's message.timestamp.type."""
        if topic not in self._timestamp_types:
            entries = self.admin.describe_configs([topic]).get(topic, [])
            value = next((e.value for e in entries if e.name == "message.timestamp.type"), "")
            self._timestamp_types[topic] = TIMESTAMP_TYPES.get(value, 0)
        return self._timestamp_types[topic]

    def tasks(self, ranges: list[OffsetRange]) -> list[FjordInputPartition]:
        options = self.options
        consumer_config = options.task_consumer_config()
        return [
            FjordInputPartition(
                topic=r.tp.topic,
                partition=r.tp.partition,
                from_offset=r.from_offset,
                until_offset=r.until_offset,
                timestamp_type=self.timestamp_type(r.tp.topic),
                include_headers=options.include_headers,
                fail_on_data_loss=options.fail_on_data_loss,
                poll_timeout_ms=options.poll_timeout_ms,
                consumer_config=consumer_config,
            )
            for r in ranges
        ]

    def close(self) -> None:
        for client in (self._consumer, self._admin):
            if client is not None:
                client.close()
        self._consumer = self._admin = None


class FjordBatchReader(DataSourceReader):
    """``spark.read.format("fjord")``: one task per partition with records between
    ``startingOffsets`` (or ``startingTimestamp``) and ``endingOffsets``, both resolved once
    when the query is planned."""

    def __init__(self, options: ReaderOptions, schema: StructType) -> None:
        self.options = options
        self.arrow_schema = arrow_schema(schema)

    def partitions(self) -> Sequence[InputPartition]:
        view = ClusterView(self.options)
        try:
            tps = view.partitions()
            start = view.starting_offsets(tps)
            end = view.ending_offsets(tps, view.earliest(tps))
            return view.plan(start, end)
        finally:
            view.close()

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, FjordInputPartition)
        return read_partition(partition, self.arrow_schema)


class FjordStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """``spark.readStream.format("fjord")``.

    Offsets are Spark's Kafka source's JSON (``{"topic": {"0": 42}}``: the next offset to read
    per partition), kept by Spark in the query's checkpoint, so a restarted query resumes
    exactly where its last committed micro-batch ended. With ``Trigger.AvailableNow`` the end
    offsets are fixed when the query starts.

    With ``kafka.group.id`` / ``groupIdPrefix`` the end of every micro-batch Spark has
    committed is also committed to that consumer group, as a report (Spark never reads it
    back): ``commit(end)`` comes one batch behind, so the start of each ``latestOffset`` call
    (the end of the last batch, committed before Spark plans the next) is reported as well.
    A report waits for its acknowledgement at most ``REPORT_WAIT_S`` (a slow or absent group
    coordinator delays one trigger by that, never more: while a report is in flight no other
    is sent or waited for); one that fails is logged and sent again at the next trigger; none
    fails the query.
    """

    def __init__(self, options: ReaderOptions, schema: StructType) -> None:
        self.options = options
        self.arrow_schema = arrow_schema(schema)
        self.view = ClusterView(options)
        # Resolved once per reader (Spark asks for the initial offset more than once: to find
        # the first batch's end and again to plan it; both must see the same start).
        self._initial: Offsets | None = None
        # Trigger.AvailableNow: the partitions and end offsets fixed when the run starts.
        self._available_now_partitions: list[TopicPartition] | None = None
        self._available_now_end: Offsets | None = None
        self._delay = (
            None
            if options.min_offsets_per_trigger is None
            else TriggerDelay(
                options.min_offsets_per_trigger, options.max_trigger_delay_ms, _now_ms()
            )
        )
        self._committer: Consumer | None = None
        self._reported: Offsets = {}
        # The report in flight and what it carries (at most one at a time).
        self._in_flight: tuple[Future[Any], Offsets] | None = None

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_committer"] = None
        state["_in_flight"] = None
        return state

    def report_to_group(self, offsets: Offsets) -> None:
        """Commit ``offsets`` (ends of micro-batches Spark has committed) to the query's group,
        if it has one and they moved. Failures are logged, never raised."""
        group = self.options.group_id
        if group is None:
            return
        if self._in_flight is not None:
            future, sent = self._in_flight
            if not future.done():
                return  # the next trigger reports the newer offsets
            self._in_flight = None
            error = future.exception()
            if error is None:
                self._reported.update(sent)
            else:
                log.warning("could not report offsets to consumer group %r: %s", group, error)
        moved = {tp: o for tp, o in offsets.items() if self._reported.get(tp) != o}
        if not moved:
            return
        try:
            if self._committer is None:
                self._committer = Consumer(self.options.group_committer_config())
            future = self._committer.commit(
                {tp: OffsetAndMetadata(o) for tp, o in moved.items()}, asynchronous=True
            )
        except FjordError as exc:
            log.warning("could not report offsets to consumer group %r: %s", group, exc)
            return
        # Wait a little: normally the report lands before Spark goes on (so the last batch of
        # an AvailableNow run is reported before Spark ends the source's process); a slow
        # coordinator costs this trigger at most REPORT_WAIT_S, later triggers nothing.
        try:
            future.result(timeout=defaults.REPORT_WAIT_S)
        except TimeoutError:
            self._in_flight = (future, moved)
            return
        except Exception as exc:
            log.warning("could not report offsets to consumer group %r: %s", group, exc)
            return
        self._reported.update(moved)

    def initialOffset(self) -> dict[str, Any]:
        """Where a query without a checkpoint starts (``startingOffsets`` or the timestamp
        options), resolved on the first call and the same on every later one. In an
        AvailableNow run it is resolved for the partitions the run reads and never past the
        run's end (``startingOffsets=latest`` with records arriving since the end was fixed
        would otherwise start after it)."""
        if self._initial is None:
            tps = self._available_now_partitions
            start = self.view.starting_offsets(self.view.partitions() if tps is None else tps)
            end = self._available_now_end
            if end is not None:
                start = {tp: min(offset, end.get(tp, offset)) for tp, offset in start.items()}
            self._initial = start
        return offsets_to_json(self._initial)

    def getDefaultReadLimit(self) -> ReadLimit:
        limit = self.options.max_offsets_per_trigger
        return ReadAllAvailable() if limit is None else ReadMaxRows(limit)

    def prepareForTriggerAvailableNow(self) -> None:
        """Fix the run's end: the latest offsets of the partitions read now (kept, so the
        initial offset that Spark asks for next needs no second Metadata request)."""
        tps = self.view.partitions()
        self._available_now_partitions = tps
        self._available_now_end = self.view.latest(tps)

    def _latest(self) -> Offsets:
        if self._available_now_end is not None:
            return dict(self._available_now_end)
        return self.view.latest(self.view.partitions())

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        begin = offsets_from_json(start)
        self.report_to_group(begin)  # the batch that ended there is committed by now
        latest = self._latest()
        new = [tp for tp in latest if tp not in begin]
        begin.update(self.view.earliest(new))
        waiting = (
            self._delay is not None
            and self._available_now_end is None
            and not (isinstance(limit, ReadAllAvailable) and self.options.max_offsets_per_trigger)
        )
        if waiting:
            assert self._delay is not None
            if self._delay.should_wait(available_records(begin, latest), _now_ms()):
                return start  # too few records yet: no micro-batch this trigger
        if isinstance(limit, ReadMaxRows):
            latest = limit_offsets(begin, latest, limit.max_rows)
        return offsets_to_json(latest)

    def reportLatestOffset(self) -> dict[str, Any] | None:
        return offsets_to_json(self._latest())

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        return self.view.plan(offsets_from_json(start), offsets_from_json(end))

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, FjordInputPartition)
        return read_partition(partition, self.arrow_schema)

    def commit(self, end: dict[str, Any]) -> None:
        """Spark committed the batches up to ``end``: report it to the group (if any). The
        checkpoint stays the truth; nothing here is read back."""
        self.report_to_group(offsets_from_json(end))

    def stop(self) -> None:
        """Close the clients; a report still in flight (the last batch of a
        ``Trigger.AvailableNow`` run, say) is waited for, up to ``REPORT_FLUSH_S``."""
        self.view.close()
        if self._in_flight is not None:
            future, _ = self._in_flight
            try:
                future.result(timeout=defaults.REPORT_FLUSH_S)
            except Exception as exc:  # a report never fails the query, not even at its end
                log.warning("the last report to group %r failed: %s", self.options.group_id, exc)
            self._in_flight = None
        if self._committer is not None:
            self._committer.close()
            self._committer = None


def _now_ms() -> int:
    return int(time.time() * 1000)


# -- writing ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class FjordCommitMessage(WriterCommitMessage):
    """What one write task reports after every record it sent was acknowledged (exactly-once:
    committed). ``skipped``: an exactly-once task found its batch already committed by an
    earlier attempt and wrote nothing."""

    records: int
    skipped: bool = False


def write_batches(options: WriterOptions, batches: Iterator[pa.RecordBatch]) -> FjordCommitMessage:
    """Send every row with one producer, then flush and check that every record was
    acknowledged: a record that was not fails the task (Spark retries it), it is never lost
    silently."""
    futures: list[RecordsFuture | RecordFuture] = []
    with Producer(options.producer_config()) as producer:
        for batch in batches:
            futures.extend(send_batch(producer, batch, options.topic))
        producer.flush()
        for future in futures:
            future.result()  # raises the typed error of a record that was not written
    return FjordCommitMessage(sum(_count(f) for f in futures))


def send_batch(
    producer: Producer, batch: pa.RecordBatch, topic_option: str | None
) -> list[RecordsFuture | RecordFuture]:
    """Queue the rows of one Arrow batch: in bulk (``Producer.send_many``: one call per topic
    and partition group, no Python per row), row by row only for a batch with headers or a
    ``partition`` column mixing null and set values (see ``batch_to_groups``)."""
    groups = batch_to_groups(batch, topic_option)
    if groups is not None:
        return [
            producer.send_many(topic, values, keys, partition)
            for topic, partition, keys, values in groups
        ]
    futures: list[RecordsFuture | RecordFuture] = []
    for topic, partition, key, value, headers in batch_to_records(batch, topic_option):
        if topic is None:
            raise ConfigError("a row has a null topic and the option topic is not set")
        futures.append(
            producer.send(topic, value=value, key=key, partition=partition, headers=headers)
        )
    return futures


def _count(future: RecordsFuture | RecordFuture) -> int:
    return future.count if isinstance(future, RecordsFuture) else 1


@dataclass(frozen=True)
class WriteTask:
    """Who an exactly-once write task is: its streaming query (id, stable across restarts from
    the checkpoint), micro-batch and write partition, read from Spark's task context."""

    query_id: str
    batch_id: int
    partition: int

    def transactional_id(self, prefix: str) -> str:
        """One id per query and write partition: every attempt of this partition's task, in
        any batch and after any restart, fences the attempts before it."""
        return f"{prefix}-{self.query_id}-{self.partition}"

    @classmethod
    def current(cls) -> WriteTask:
        """The running task's identity. Raises ConfigError outside a streaming query's task
        (Spark sets the query id and batch id as local properties of its jobs)."""
        from pyspark import TaskContext

        context = TaskContext.get()
        query_id = context.getLocalProperty(QUERY_ID_PROPERTY) if context else None
        batch_id = context.getLocalProperty(BATCH_ID_PROPERTY) if context else None
        if context is None or not query_id or batch_id is None:
            raise ConfigError(
                "exactlyOnce: this write task runs outside a streaming micro-batch (Spark's "
                f"task properties {QUERY_ID_PROPERTY} and {BATCH_ID_PROPERTY} are missing)"
            )
        return cls(query_id, int(batch_id), context.partitionId())


#: Local properties Spark's MicroBatchExecution sets on every job of a micro-batch.
QUERY_ID_PROPERTY = "sql.streaming.queryId"
BATCH_ID_PROPERTY = "streaming.sql.batchId"


def _first_topic(options: WriterOptions, batch: pa.RecordBatch) -> str:
    """The topic of the batch's first row (the ``topic`` option when set)."""
    if options.topic is not None:
        return options.topic
    topic = batch.column("topic")[0].as_py()
    if topic is None:
        raise ConfigError("a row has a null topic and the option topic is not set")
    return str(topic)


def committed_batches(options: WriterOptions, transactional_id: str, marker: TopicPartition) -> int:
    """How many micro-batches of this write partition are committed: the offset the last
    committed transaction stored as its marker (batch id + 1), 0 when none is. Read with
    require_stable (read_committed), so an open transaction's marker is waited out, never
    read half-done."""
    with Consumer(options.marker_reader_config(transactional_id)) as reader:
        found = reader.committed([marker])[marker]
    return 0 if found is None else found


def write_exactly_once(
    options: WriterOptions, batches: Iterator[pa.RecordBatch], task: WriteTask
) -> FjordCommitMessage:
    """Write the task's rows in one transaction that also commits the batch marker, unless an
    earlier attempt already committed this batch (then write nothing).

    Order matters: ``init_transactions`` first fences every earlier attempt of this partition
    (its open transaction is aborted, it can no longer commit), and only then is the marker
    read, so no attempt can commit between the check and this task's own commit. The marker is
    the offset ``batch_id + 1`` of partition 0 of the first row's topic (``topic`` option when
    set) in the consumer group named like the transactional id, committed by
    ``send_offsets_to_transaction`` atomically with the records. A task without rows writes
    and marks nothing (a rerun of it has nothing to duplicate)."""
    rows = (batch for batch in batches if batch.num_rows)
    first = next(rows, None)
    if first is None:
        return FjordCommitMessage(0)
    transactional_id = task.transactional_id(options.transactional_id_prefix)
    marker = TopicPartition(_first_topic(options, first), 0)
    with Producer(options.transactional_producer_config(transactional_id)) as producer:
        producer.init_transactions()
        done = committed_batches(options, transactional_id, marker)
        if done > task.batch_id:
            log.info(
                "batch %d partition %d: already committed by an earlier attempt (%s), skipped",
                task.batch_id,
                task.partition,
                transactional_id,
            )
            return FjordCommitMessage(0, skipped=True)
        producer.begin_transaction()
        sent = 0
        try:
            for batch in itertools.chain([first], rows):
                sent += sum(_count(f) for f in send_batch(producer, batch, options.topic))
            producer.send_offsets_to_transaction(
                {marker: OffsetAndMetadata(task.batch_id + 1, f"spark batch {task.batch_id}")},
                transactional_id,
            )
            producer.commit_transaction()
        except BaseException:
            _abort_quietly(producer, transactional_id)
            raise
    return FjordCommitMessage(sent)


def _abort_quietly(producer: Producer, transactional_id: str) -> None:
    """Abort after a failure, keeping the original error: a fenced producer cannot abort (its
    successor already did), and the next attempt aborts anything left open all the same."""
    try:
        producer.abort_transaction()
    except FjordError as exc:
        log.warning("could not abort the transaction of %s: %s", transactional_id, exc)


class FjordBatchWriter(DataSourceArrowWriter):
    """``df.write.format("fjord")``: each task produces its rows and succeeds only when all were
    acknowledged (at-least-once: a retried task may write some rows twice, as in Kafka)."""

    def __init__(self, options: WriterOptions) -> None:
        self.options = options

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:
        return write_batches(self.options, iterator)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        log.info("wrote %d records", sum(getattr(m, "records", 0) for m in messages))

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        log.warning("write aborted: records of finished tasks stay in the topic")


class FjordStreamWriter(DataSourceStreamArrowWriter):
    """``df.writeStream.format("fjord")``: like the batch writer, per micro-batch."""

    def __init__(self, options: WriterOptions) -> None:
        self.options = options

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:
        return write_batches(self.options, iterator)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        log.info(
            "batch %d: wrote %d records", batchId, sum(getattr(m, "records", 0) for m in messages)
        )

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        log.warning("batch %d aborted: records of finished tasks stay in the topic", batchId)


class FjordExactlyOnceStreamWriter(DataSourceStreamArrowWriter):
    """``df.writeStream.format("fjord").option("exactlyOnce", "true")``: each write task of a
    micro-batch writes its rows in one transaction with transactional id
    ``<transactionalIdPrefix>-<query id>-<partition>`` and commits it together with a marker
    of the batch; a retried or re-run task fences earlier attempts and skips a batch the marker
    shows committed. Guarantee and limits: docs/spark.md."""

    def __init__(self, options: WriterOptions) -> None:
        self.options = options

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:
        return write_exactly_once(self.options, iterator, WriteTask.current())

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        skipped = sum(1 for m in messages if getattr(m, "skipped", False))
        log.info(
            "batch %d: committed %d records (%d tasks found the batch committed already)",
            batchId,
            sum(getattr(m, "records", 0) for m in messages),
            skipped,
        )

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        log.warning(
            "batch %d aborted: tasks that committed their transaction stay committed and are "
            "skipped when the batch runs again; the others' transactions are aborted",
            batchId,
        )
