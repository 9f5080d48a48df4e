"""Fjord: a distributed, replicated commit log with Kafka's model, written in Python."""

__version__ = "0.1.0"
