"""Timestamps from inside a broker for bench/latency_breakdown.py ``--broker-stages``.

Python imports ``sitecustomize`` at start-up from the path; latency_breakdown.py puts this
directory first on the PYTHONPATH of the cluster it starts and names an output prefix in
``FJORD_BENCH_BROKER_STAGES``. Every other process, and every process without that variable,
is left alone. In a broker (the process that imports ``fjord.broker.service``) it records, with
``time.perf_counter_ns`` (CLOCK_MONOTONIC: the same clock as the clients' timestamps):

- ``produce <topic> <base offset> <in> <out>``: BrokerServicer.Produce entered and returned;
- ``fetch <topic> <fetch offset> <in> <out>``: a consumer's Fetch that returned records;
- ``late <at> <ns>``: the event loop ran a 1 ms timer more than 1 ms late (the loop busy, the
  GIL held by another thread, or the process not scheduled);
- ``gc <at> <ns> <generation>``: a garbage collection of more than 0.1 ms.

and writes them to ``<prefix>.<pid>`` at exit. The broker's code is unchanged: the servicer's
two methods are wrapped once its module is imported.
"""

from __future__ import annotations

import os

OUT_ENV_VAR = "FJORD_BENCH_BROKER_STAGES"

if os.environ.get(OUT_ENV_VAR):
    import asyncio
    import atexit
    import gc
    import importlib.abc
    import importlib.machinery
    import sys
    import time
    from types import ModuleType
    from typing import Any

    _events: list[str] = []
    _now = time.perf_counter_ns

    def _last_partition(message: Any) -> tuple[str, Any]:
        name, last = "?", None
        for topic in message.topics:
            for partition in topic.partitions:
                name, last = topic.name, partition
        return name, last

    async def _watch_loop() -> None:
        while True:
            started = _now()
            await asyncio.sleep(0.001)
            late = _now() - started - 1_000_000
            if late > 1_000_000:
                _events.append(f"late {started} {late}")

    def _on_gc(phase: str, info: dict[str, int], started: list[int] = [0]) -> None:  # noqa: B006
        if phase == "start":
            started[0] = _now()
            return
        took = _now() - started[0]
        if took > 100_000:
            _events.append(f"gc {started[0]} {took} {info['generation']}")

    def _wrap(module: ModuleType) -> None:
        servicer = module.BrokerServicer
        produce, fetch = servicer.Produce, servicer.Fetch
        watching: list[asyncio.Task[None]] = []

        async def timed_produce(self: Any, request: Any, context: Any) -> Any:
            if not watching:
                watching.append(asyncio.get_running_loop().create_task(_watch_loop()))
            entered = _now()
            response = await produce(self, request, context)
            name, last = _last_partition(response)
            if last is not None:
                _events.append(f"produce {name} {last.base_offset} {entered} {_now()}")
            return response

        async def timed_fetch(self: Any, request: Any, context: Any) -> Any:
            entered = _now()
            response = await fetch(self, request, context)
            if request.replica_id < 0:
                name, asked = _last_partition(request)
                _, answer = _last_partition(response)
                if asked is not None and answer is not None and answer.records:
                    _events.append(f"fetch {name} {asked.fetch_offset} {entered} {_now()}")
            return response

        servicer.Produce, servicer.Fetch = timed_produce, timed_fetch
        gc.callbacks.append(_on_gc)

    class _WrapServiceOnImport(importlib.abc.MetaPathFinder):
        def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
            if name != "fjord.broker.service":
                return None
            sys.meta_path.remove(self)
            spec = importlib.machinery.PathFinder.find_spec(name, path)
            if spec is None or spec.loader is None:
                return spec
            loader = spec.loader
            execute = loader.exec_module

            def exec_module(module: ModuleType) -> None:
                execute(module)
                _wrap(module)

            loader.exec_module = exec_module  # type: ignore[method-assign]
            return spec

    sys.meta_path.insert(0, _WrapServiceOnImport())

    def _write() -> None:
        if not _events:
            return
        with open(f"{os.environ[OUT_ENV_VAR]}.{os.getpid()}", "w") as out:
            out.write("\n".join(_events) + "\n")

    atexit.register(_write)
