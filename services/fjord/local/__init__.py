"""Run a whole Fjord cluster on one machine (``fjord local``) and in tests: a single-member
etcd, controllers and brokers as child processes under one data directory. For local use and
tests only; production runs a real etcd cluster and the services on Kubernetes."""

from fjord.local.cluster import (
    ClusterStateError,
    LocalCluster,
    ProcessInfo,
    read_state,
    restart_dead_processes,
    stop_from_state,
)
from fjord.local.etcd import EtcdNotFoundError, EtcdProcess, ProcessStartError, find_etcd_binary
from fjord.local.find import find_data_dir, resolve_data_dir
from fjord.local.ports import PortInUseError, choose_broker_port

__all__ = [
    "ClusterStateError",
    "EtcdNotFoundError",
    "EtcdProcess",
    "LocalCluster",
    "PortInUseError",
    "ProcessInfo",
    "ProcessStartError",
    "choose_broker_port",
    "find_data_dir",
    "find_etcd_binary",
    "read_state",
    "resolve_data_dir",
    "restart_dead_processes",
    "stop_from_state",
]
