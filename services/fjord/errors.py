"""Typed errors shared by every Fjord component.

Each error carries an :class:`ErrorCode`: Kafka's name and numeric code where Kafka has one, and
whether a client may retry the request after refreshing metadata. Servers put the code on the wire;
clients turn it back into the matching exception with :func:`error_for_code`.
"""

from __future__ import annotations

from enum import Enum


class ErrorCode(Enum):
    """Kafka's error names and codes, with a retriable flag (value = (code, retriable))."""

    NONE = (0, False)
    UNKNOWN_SERVER_ERROR = (-1, False)
    OFFSET_OUT_OF_RANGE = (1, False)
    CORRUPT_MESSAGE = (2, True)
    UNKNOWN_TOPIC_OR_PARTITION = (3, True)
    INVALID_FETCH_SIZE = (4, False)
    LEADER_NOT_AVAILABLE = (5, True)
    NOT_LEADER_OR_FOLLOWER = (6, True)
    REQUEST_TIMED_OUT = (7, True)
    BROKER_NOT_AVAILABLE = (8, True)
    REPLICA_NOT_AVAILABLE = (9, True)
    MESSAGE_TOO_LARGE = (10, False)
    NETWORK_EXCEPTION = (13, True)
    COORDINATOR_LOAD_IN_PROGRESS = (14, True)
    COORDINATOR_NOT_AVAILABLE = (15, True)
    NOT_COORDINATOR = (16, True)
    INVALID_TOPIC_EXCEPTION = (17, False)
    RECORD_LIST_TOO_LARGE = (18, False)
    NOT_ENOUGH_REPLICAS = (19, True)
    NOT_ENOUGH_REPLICAS_AFTER_APPEND = (20, True)
    INVALID_REQUIRED_ACKS = (21, False)
    ILLEGAL_GENERATION = (22, False)
    INCONSISTENT_GROUP_PROTOCOL = (23, False)
    INVALID_GROUP_ID = (24, False)
    UNKNOWN_MEMBER_ID = (25, False)
    INVALID_SESSION_TIMEOUT = (26, False)
    REBALANCE_IN_PROGRESS = (27, False)
    INVALID_COMMIT_OFFSET_SIZE = (28, False)
    OFFSET_METADATA_TOO_LARGE = (12, False)
    GROUP_MAX_SIZE_REACHED = (81, False)
    INVALID_TIMESTAMP = (32, False)
    INVALID_REQUEST = (42, False)
    TOPIC_ALREADY_EXISTS = (36, False)
    INVALID_PARTITIONS = (37, False)
    INVALID_REPLICATION_FACTOR = (38, False)
    INVALID_REPLICA_ASSIGNMENT = (39, False)
    INVALID_CONFIG = (40, False)
    NOT_CONTROLLER = (41, True)
    POLICY_VIOLATION = (44, False)
    OUT_OF_ORDER_SEQUENCE_NUMBER = (45, False)
    DUPLICATE_SEQUENCE_NUMBER = (46, False)
    INVALID_PRODUCER_EPOCH = (47, False)
    TRANSACTION_COORDINATOR_FENCED = (52, False)
    KAFKA_STORAGE_ERROR = (56, True)
    UNKNOWN_PRODUCER_ID = (59, False)
    NON_EMPTY_GROUP = (68, False)
    GROUP_ID_NOT_FOUND = (69, False)
    FENCED_LEADER_EPOCH = (74, True)
    UNKNOWN_LEADER_EPOCH = (75, True)
    OFFSET_NOT_AVAILABLE = (78, True)
    MEMBER_ID_REQUIRED = (79, False)
    PREFERRED_LEADER_NOT_AVAILABLE = (80, True)
    FENCED_INSTANCE_ID = (82, False)
    ELIGIBLE_LEADERS_NOT_AVAILABLE = (83, True)
    ELECTION_NOT_NEEDED = (84, False)
    NO_REASSIGNMENT_IN_PROGRESS = (85, False)
    REASSIGNMENT_IN_PROGRESS = (60, False)
    UNSUPPORTED_COMPRESSION_TYPE = (76, False)
    INVALID_RECORD = (87, False)
    UNSTABLE_OFFSET_COMMIT = (88, True)
    INCONSISTENT_TOPIC_ID = (103, True)
    STALE_BROKER_EPOCH = (77, False)
    INVALID_UPDATE_VERSION = (95, False)
    INELIGIBLE_REPLICA = (107, False)
    UNSUPPORTED_VERSION = (35, False)
    UNSUPPORTED_SASL_MECHANISM = (33, False)
    ILLEGAL_SASL_STATE = (34, False)
    SASL_AUTHENTICATION_FAILED = (58, False)
    RESOURCE_NOT_FOUND = (91, False)
    DUPLICATE_RESOURCE = (92, False)
    UNACCEPTABLE_CREDENTIAL = (93, False)
    FETCH_SESSION_ID_NOT_FOUND = (70, True)
    INVALID_FETCH_SESSION_EPOCH = (71, True)
    LISTENER_NOT_FOUND = (72, True)
    UNSUPPORTED_ENDPOINT_TYPE = (115, False)
    TOPIC_AUTHORIZATION_FAILED = (29, False)
    GROUP_AUTHORIZATION_FAILED = (30, False)
    CLUSTER_AUTHORIZATION_FAILED = (31, False)
    TRANSACTIONAL_ID_AUTHORIZATION_FAILED = (53, False)
    INVALID_TXN_STATE = (48, False)
    INVALID_PRODUCER_ID_MAPPING = (49, False)
    INVALID_TRANSACTION_TIMEOUT = (50, False)
    CONCURRENT_TRANSACTIONS = (51, True)
    PRODUCER_FENCED = (90, False)
    TRANSACTION_ABORTABLE = (120, False)
    OPERATION_NOT_ATTEMPTED = (55, False)
    TRANSACTIONAL_ID_NOT_FOUND = (105, False)

    @property
    def code(self) -> int:
        return self.value[0]

    @property
    def retriable(self) -> bool:
        return self.value[1]


_BY_NUMBER = {e.code: e for e in ErrorCode}


class FjordError(Exception):
    """Base of every Fjord error. ``code`` says which Kafka error it is."""

    code: ErrorCode = ErrorCode.UNKNOWN_SERVER_ERROR

    def __init__(self, message: str = "", code: ErrorCode | None = None) -> None:
        super().__init__(message or (code or self.code).name)
        if code is not None:
            self.code = code

    @property
    def retriable(self) -> bool:
        return self.code.retriable


class ConfigError(FjordError, ValueError):
    """An unknown configuration key or an invalid value; the message names the key."""

    code = ErrorCode.INVALID_CONFIG


class CorruptRecordError(FjordError):
    """Bytes that are not a valid RecordBatch v2: bad CRC, magic, length or record count."""

    code = ErrorCode.CORRUPT_MESSAGE


class LogDamagedError(CorruptRecordError):
    """A stored batch failed its check when read or scrubbed (bytes damaged at rest); the
    message names the partition, the offset and the way forward; ``offset`` is the first
    offset of the damage."""

    def __init__(self, message: str, *, offset: int) -> None:
        super().__init__(message)
        self.offset = offset


class RecordDeserializationError(CorruptRecordError):
    """``poll()`` reached fetched records it cannot return (Kafka's
    RecordDeserializationException): a batch with a bad CRC, one that does not decompress or
    decode, or any other failure while records were being collected. The cause is
    ``__cause__``.

    Everything of ``topic``-``partition`` before ``offset`` has been returned, and the position
    stays at ``offset``: every ``poll()`` that has nothing else to return raises this again
    until the application seeks past it. ``resume_offset`` is the base offset of the next
    intact batch in the fetched data when there is one (``None`` otherwise): seeking there
    skips exactly the damaged batch.
    """

    def __init__(
        self,
        message: str,
        *,
        topic: str,
        partition: int,
        offset: int,
        resume_offset: int | None = None,
    ) -> None:
        super().__init__(message)
        self.topic = topic
        self.partition = partition
        self.offset = offset
        self.resume_offset = resume_offset


class InvalidRecordError(FjordError):
    """A well-formed batch that breaks a rule (e.g. offsets or timestamps out of order)."""

    code = ErrorCode.INVALID_RECORD


class RecordTooLargeError(FjordError):
    """A batch or record larger than ``max.message.bytes`` (or the fetch size)."""

    code = ErrorCode.MESSAGE_TOO_LARGE


class InvalidTimestampError(FjordError):
    """A record timestamp outside the topic's ``message.timestamp.difference.max.ms`` of the
    broker's clock (Kafka's InvalidTimestampException); nothing of the batch is appended."""

    code = ErrorCode.INVALID_TIMESTAMP


class UnsupportedCompressionError(FjordError):
    """A compression codec id that Fjord does not know."""

    code = ErrorCode.UNSUPPORTED_COMPRESSION_TYPE


class OffsetOutOfRangeError(FjordError):
    """An offset below the log start offset or above the log end offset."""

    code = ErrorCode.OFFSET_OUT_OF_RANGE


class StorageError(FjordError):
    """The log directory could not be read or written (disk error, bad layout)."""

    code = ErrorCode.KAFKA_STORAGE_ERROR


_CLASS_BY_CODE: dict[ErrorCode, type[FjordError]] = {}


def register_error_class(cls: type[FjordError]) -> type[FjordError]:
    """Make ``cls`` the exception raised for its ``code`` by :func:`error_for_code`."""
    _CLASS_BY_CODE[cls.code] = cls
    return cls


for _cls in (
    ConfigError,
    CorruptRecordError,
    InvalidRecordError,
    RecordTooLargeError,
    UnsupportedCompressionError,
    OffsetOutOfRangeError,
    StorageError,
):
    register_error_class(_cls)


def error_code_from_number(number: int) -> ErrorCode:
    """The :class:`ErrorCode` for a wire number; unknown numbers map to UNKNOWN_SERVER_ERROR."""
    return _BY_NUMBER.get(number, ErrorCode.UNKNOWN_SERVER_ERROR)


def error_for_code(code: ErrorCode, message: str = "") -> FjordError:
    """The exception instance a client raises for an error code received from a server."""
    cls = _CLASS_BY_CODE.get(code, FjordError)
    return cls(message, code=code)


@register_error_class
class ClusterAuthorizationError(FjordError):
    """The caller lacks the cluster service identity an inter-broker request needs."""

    code = ErrorCode.CLUSTER_AUTHORIZATION_FAILED


@register_error_class
class TopicAuthorizationError(FjordError):
    """The caller's principal may not do this on the topic (an ACL denies it or none allows)."""

    code = ErrorCode.TOPIC_AUTHORIZATION_FAILED


@register_error_class
class GroupAuthorizationError(FjordError):
    """The caller's principal may not do this on the consumer group."""

    code = ErrorCode.GROUP_AUTHORIZATION_FAILED



# Broker request errors (Kafka's names). Clients refresh metadata and retry the retriable ones.


@register_error_class
class UnknownTopicOrPartitionError(FjordError):
    """The topic or partition does not exist (in this broker's view of the metadata)."""

    code = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION


@register_error_class
class NotLeaderOrFollowerError(FjordError):
    """This broker is not the leader (or not a replica) of the partition asked for."""

    code = ErrorCode.NOT_LEADER_OR_FOLLOWER


@register_error_class
class LeaderNotAvailableError(FjordError):
    """The partition has no leader at the moment (an election is in progress)."""

    code = ErrorCode.LEADER_NOT_AVAILABLE


@register_error_class
class FencedLeaderEpochError(FjordError):
    """The request carries an older leader epoch than the broker knows."""

    code = ErrorCode.FENCED_LEADER_EPOCH


@register_error_class
class UnknownLeaderEpochError(FjordError):
    """The request carries a newer leader epoch than the broker knows (its metadata lags)."""

    code = ErrorCode.UNKNOWN_LEADER_EPOCH


@register_error_class
class NotEnoughReplicasError(FjordError):
    """acks=all and the ISR is smaller than min.insync.replicas: nothing was appended."""

    code = ErrorCode.NOT_ENOUGH_REPLICAS


@register_error_class
class NotEnoughReplicasAfterAppendError(FjordError):
    """acks=all: the batch was appended, but the ISR fell below min.insync.replicas before it
    was replicated to all of it (it may or may not be committed; retrying may duplicate it)."""

    code = ErrorCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND


@register_error_class
class InvalidRequiredAcksError(FjordError):
    """acks is not 0, 1 or -1 (all)."""

    code = ErrorCode.INVALID_REQUIRED_ACKS


@register_error_class
class RequestTimedOutError(FjordError):
    """The request's wait (e.g. acks=all replication) did not finish within its timeout."""

    code = ErrorCode.REQUEST_TIMED_OUT


@register_error_class
class InvalidRequestError(FjordError):
    """A malformed request (e.g. a negative size) that no retry will fix."""

    code = ErrorCode.INVALID_REQUEST


# Controller (admin and AlterPartition) errors, Kafka's names.


@register_error_class
class InvalidTopicError(FjordError):
    """A topic name that breaks Kafka's rules (characters, length, '.'/'..', collisions)."""

    code = ErrorCode.INVALID_TOPIC_EXCEPTION


@register_error_class
class TopicAlreadyExistsError(FjordError):
    """CreateTopics for a name that already exists."""

    code = ErrorCode.TOPIC_ALREADY_EXISTS


@register_error_class
class InvalidPartitionsError(FjordError):
    """A partition count below 1, or fewer partitions than a topic already has."""

    code = ErrorCode.INVALID_PARTITIONS


@register_error_class
class InvalidReplicationFactorError(FjordError):
    """A replication factor below 1 or above the number of live brokers."""

    code = ErrorCode.INVALID_REPLICATION_FACTOR


@register_error_class
class InvalidReplicaAssignmentError(FjordError):
    """A manual replica assignment with unknown brokers, duplicates or uneven sizes."""

    code = ErrorCode.INVALID_REPLICA_ASSIGNMENT


@register_error_class
class NotControllerError(FjordError):
    """This controller is not (or no longer) the active one; ask the one in Metadata."""

    code = ErrorCode.NOT_CONTROLLER


@register_error_class
class PolicyViolationError(FjordError):
    """A request the cluster's limits refuse (e.g. more metadata records in one operation than
    ``max.records.per.user.op``, or more replicas on a broker than ``max.broker.partitions``);
    the message names the limit and how to raise it."""

    code = ErrorCode.POLICY_VIOLATION


@register_error_class
class StaleBrokerEpochError(FjordError):
    """A broker request carries a broker epoch that is not the broker's current registration."""

    code = ErrorCode.STALE_BROKER_EPOCH


@register_error_class
class InvalidUpdateVersionError(FjordError):
    """AlterPartition with a partition epoch other than the current one."""

    code = ErrorCode.INVALID_UPDATE_VERSION


@register_error_class
class IneligibleReplicaError(FjordError):
    """AlterPartition would put a replica into the ISR that is not live or not assigned."""

    code = ErrorCode.INELIGIBLE_REPLICA


@register_error_class
class PreferredLeaderNotAvailableError(FjordError):
    """A preferred election cannot move leadership: the preferred replica is not live or not
    in the ISR."""

    code = ErrorCode.PREFERRED_LEADER_NOT_AVAILABLE


@register_error_class
class EligibleLeadersNotAvailableError(FjordError):
    """An (unclean) election found no live replica that may lead."""

    code = ErrorCode.ELIGIBLE_LEADERS_NOT_AVAILABLE


@register_error_class
class ElectionNotNeededError(FjordError):
    """The requested election changes nothing: the partition already has the leader it would
    get."""

    code = ErrorCode.ELECTION_NOT_NEEDED


@register_error_class
class NoReassignmentInProgressError(FjordError):
    """Cancelling a reassignment of a partition that is not being reassigned."""

    code = ErrorCode.NO_REASSIGNMENT_IN_PROGRESS


@register_error_class
class ReassignmentInProgressError(FjordError):
    """The request conflicts with a running reassignment (e.g. changing the replication factor
    of a topic whose partitions are still moving)."""

    code = ErrorCode.REASSIGNMENT_IN_PROGRESS


# Idempotent producer errors (Kafka's names; see docs/idempotence.md).


@register_error_class
class OutOfOrderSequenceError(FjordError):
    """An idempotent batch whose first sequence is not the one after the producer's last batch
    in this partition (a gap: an earlier batch was lost or is still being retried)."""

    code = ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER


@register_error_class
class DuplicateSequenceError(FjordError):
    """A duplicate idempotent batch the broker can no longer map to its offset."""

    code = ErrorCode.DUPLICATE_SEQUENCE_NUMBER


@register_error_class
class InvalidProducerEpochError(FjordError):
    """A batch from an older epoch of a producer id than the partition has seen (a zombie)."""

    code = ErrorCode.INVALID_PRODUCER_EPOCH


@register_error_class
class UnknownProducerIdError(FjordError):
    """A batch with a non-zero first sequence from a producer the partition has no state for
    (its state expired or its records were deleted): the producer must reset its sequences."""

    code = ErrorCode.UNKNOWN_PRODUCER_ID


# Consumer group errors (Kafka's names; see docs/groups.md).


@register_error_class
class IllegalGenerationError(FjordError):
    """A group request carries a generation id other than the group's current one."""

    code = ErrorCode.ILLEGAL_GENERATION


@register_error_class
class UnknownMemberIdError(FjordError):
    """A group request names a member id the group does not know (expired, left or fenced)."""

    code = ErrorCode.UNKNOWN_MEMBER_ID


@register_error_class
class RebalanceInProgressError(FjordError):
    """The group is rebalancing: the member must rejoin (JoinGroup) before it may go on."""

    code = ErrorCode.REBALANCE_IN_PROGRESS


@register_error_class
class MemberIdRequiredError(FjordError):
    """First JoinGroup of a dynamic member: rejoin with the member id the response carries."""

    code = ErrorCode.MEMBER_ID_REQUIRED


@register_error_class
class CoordinatorFencedError(FjordError):
    """An append to ``__consumer_offsets`` carries an older coordinator epoch than the
    partition's leader knows: a newer coordinator owns the partition, this one is a zombie
    (Kafka's TRANSACTION_COORDINATOR_FENCED, its answer to a stale coordinator's
    WriteTxnMarkers). Not retriable: no retry makes the epoch newer."""

    code = ErrorCode.TRANSACTION_COORDINATOR_FENCED


@register_error_class
class FencedInstanceIdError(FjordError):
    """A static member (``group.instance.id``) was replaced by a newer member with the same
    instance id: this old member id is fenced."""

    code = ErrorCode.FENCED_INSTANCE_ID


@register_error_class
class InconsistentGroupProtocolError(FjordError):
    """The member's protocol type or protocols share nothing with the group's."""

    code = ErrorCode.INCONSISTENT_GROUP_PROTOCOL


@register_error_class
class InvalidGroupIdError(FjordError):
    """An empty or otherwise invalid group id."""

    code = ErrorCode.INVALID_GROUP_ID


@register_error_class
class InvalidSessionTimeoutError(FjordError):
    """session.timeout.ms outside [group.min.session.timeout.ms, group.max.session.timeout.ms]."""

    code = ErrorCode.INVALID_SESSION_TIMEOUT


@register_error_class
class NonEmptyGroupError(FjordError):
    """The operation (delete, offset reset) needs a group without active members."""

    code = ErrorCode.NON_EMPTY_GROUP


@register_error_class
class GroupIdNotFoundError(FjordError):
    """The group does not exist (or is already dead)."""

    code = ErrorCode.GROUP_ID_NOT_FOUND


@register_error_class
class OffsetMetadataTooLargeError(FjordError):
    """An offset commit's metadata string is longer than ``offset.metadata.max.bytes``."""

    code = ErrorCode.OFFSET_METADATA_TOO_LARGE


@register_error_class
class CoordinatorNotAvailableError(FjordError):
    """The group coordinator is not serving this group (unloaded or dead group): look it up."""

    code = ErrorCode.COORDINATOR_NOT_AVAILABLE


@register_error_class
class GroupMaxSizeReachedError(FjordError):
    """The group already has ``group.max.size`` members."""

    code = ErrorCode.GROUP_MAX_SIZE_REACHED


class KafkaTimeoutError(RequestTimedOutError, TimeoutError):
    """A client-side deadline passed (``delivery.timeout.ms``, ``request.timeout.ms``,
    ``max.block.ms``, ``default.api.timeout.ms``), typically because a broker is down or
    unreachable. Also a built-in ``TimeoutError``. Not registered: the wire code
    REQUEST_TIMED_OUT still maps to :class:`RequestTimedOutError`."""


class CommitFailedError(FjordError):
    """An offset commit of a group member was refused because the member is no longer part of
    the current generation (Kafka's CommitFailedException): the group rebalanced, or the
    member was removed (e.g. after exceeding ``max.poll.interval.ms``) and its partitions may
    belong to someone else now. ``code`` is the coordinator's answer (ILLEGAL_GENERATION,
    UNKNOWN_MEMBER_ID, REBALANCE_IN_PROGRESS, FENCED_INSTANCE_ID). Client-side only: not
    registered for a wire code."""

    code = ErrorCode.ILLEGAL_GENERATION


class MaxPollIntervalExceededError(FjordError):
    """The application called ``poll()`` later than ``max.poll.interval.ms`` after the previous
    call, so the consumer left its group and its partitions were given to other members.
    Process records faster, lower ``max.poll.records``, or raise ``max.poll.interval.ms``; the
    next ``poll()`` rejoins the group. Client-side only (code REBALANCE_IN_PROGRESS)."""

    code = ErrorCode.REBALANCE_IN_PROGRESS


# Transaction errors (Kafka's names; see docs/transactions.md).


@register_error_class
class ProducerFencedError(FjordError):
    """A newer producer with the same ``transactional.id`` called InitProducerId (its epoch
    is higher): this one is a zombie and must close. Fatal for the producer."""

    code = ErrorCode.PRODUCER_FENCED


@register_error_class
class InvalidTxnStateError(FjordError):
    """The transactional request does not fit the transaction's state (commit after an abort
    began, EndTxn with no transaction, a producer call out of order). Fatal for the producer
    when the coordinator answers it; the client's own misuse is raised before any request."""

    code = ErrorCode.INVALID_TXN_STATE


@register_error_class
class InvalidProducerIdMappingError(FjordError):
    """The producer id in a transactional request is not the one the coordinator maps its
    ``transactional.id`` to (the id expired or another producer took it)."""

    code = ErrorCode.INVALID_PRODUCER_ID_MAPPING


@register_error_class
class InvalidTransactionTimeoutError(FjordError):
    """``transaction.timeout.ms`` is not positive or above the coordinator's
    ``transaction.max.timeout.ms``."""

    code = ErrorCode.INVALID_TRANSACTION_TIMEOUT


@register_error_class
class ConcurrentTransactionsError(FjordError):
    """The coordinator is still completing the previous transaction of this
    ``transactional.id`` (writing its markers) or a state write is in flight: retry."""

    code = ErrorCode.CONCURRENT_TRANSACTIONS


class TransactionError(FjordError):
    """A transactional producer's failure, classified as confluent-kafka's KafkaError:

    - :meth:`txn_requires_abort`: the current transaction cannot commit (a record failed, the
      coordinator aborted it on timeout): call ``abort_transaction()``, then begin anew;
    - :attr:`fatal`: the producer cannot go on (fenced by a newer instance, an invalid state
      the coordinator refused): close it;
    - :meth:`retriable`: the call may simply be retried (a timeout).

    ``cause`` is the underlying typed error, whose ``code`` this error carries."""

    def __init__(
        self,
        message: str,
        code: ErrorCode,
        *,
        abortable: bool = False,
        fatal: bool = False,
        retriable: bool = False,
        cause: BaseException | None = None,
    ) -> None:
        super().__init__(message, code)
        self.abortable = abortable
        self.fatal = fatal
        self._retriable = retriable
        self.cause = cause

    def txn_requires_abort(self) -> bool:
        return self.abortable

    @property
    def retriable(self) -> bool:
        return self._retriable


class TransactionAbortedError(TransactionError):
    """The transaction must be aborted (``txn_requires_abort()`` is True)."""

    def __init__(self, message: str, code: ErrorCode, cause: BaseException | None = None):
        super().__init__(message, code, abortable=True, cause=cause)
