"""Fjord's Spark pipelines for the seeds' scenarios (see docs/spark-jobs.md).

Each module is one job with a ``main()`` (run it as ``python -m fjord_jobs.<job>`` or hand its
file to ``spark-submit``) and pure transformation functions that take and return DataFrames:

- :mod:`fjord_jobs.orders_shipments`: orders -> shipments (order and shipping services decoupled
  through the log),
- :mod:`fjord_jobs.log_analysis`: log collection and windowed analysis,
- :mod:`fjord_jobs.risk_control`: per-user transaction velocity and alerts.
"""
