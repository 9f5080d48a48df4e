"""Run a whole Fjord cluster on one machine (``fjord local``) and in tests: a single-member
etcd, controllers and brokers as child processes under one data directory. For local use and
tests only; production runs a real etcd cluster and the services on Kubernetes."""

from fjord.local.cluster import (
    ClusterStateError,
    LocalCluster,
    ProcessInfo,
    read_state,
    stop_from_state,
)
from fjord.local.etcd import EtcdNotFoundError, EtcdProcess, ProcessStartError, find_etcd_binary

__all__ = [
    "ClusterStateError",
    "EtcdNotFoundError",
    "EtcdProcess",
    "LocalCluster",
    "ProcessInfo",
    "ProcessStartError",
    "find_etcd_binary",
    "read_state",
    "stop_from_state",
]
