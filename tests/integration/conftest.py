"""The shared integration fixtures (``etcd``, ``cluster_id``, ``local_cluster``, ``bootstrap``)
live in tests/conftest.py, so that every test directory (integration, spark, ...) shares one
session cluster. Put fixtures only integration tests use here."""
