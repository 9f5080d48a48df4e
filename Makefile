# Fjord's developer entry points. `make run` and `make test` are all a fresh machine needs:
# both create .venv and install everything into it on first use.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
PROTO_SRC := $(wildcard proto/fjord/v1/*.proto)

.PHONY: all install run test lint typecheck unit integration bench bench-deps proto proto-check clean java-check

all: test

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11))' || { echo "Fjord needs Python >= 3.11 (found $$($(PYTHON) --version))"; exit 1; }
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	@touch $(STAMP)

install: $(STAMP)

## run: the main demonstration (see README)
run: $(STAMP)
	$(VENV)/bin/fjord quickstart

## demo-storage: write, read and crash-recover one partition log (no cluster)
demo-storage: $(STAMP)
	$(VENV)/bin/fjord demo

## test: lint, type checks and the whole test suite
test: $(STAMP) java-check lint typecheck
	$(PY) -m pytest -q

lint: $(STAMP)
	$(VENV)/bin/ruff check services spark tests bench

## java-check: the Spark tests (tests/spark) need Java 17+
java-check:
	@major=$$(java -version 2>&1 | awk -F'"' '/version/ {split($$2, v, "."); print (v[1] == "1" ? v[2] : v[1]); exit}'); \
	if [ -z "$$major" ] || [ "$$major" -lt 17 ]; then echo "Spark needs Java 17+ (found: $${major:-none}); install it with: apt-get install -y openjdk-17-jre-headless"; exit 1; fi

typecheck: $(STAMP)
	$(VENV)/bin/mypy

unit: $(STAMP)
	$(PY) -m pytest -q tests/unit

bench: $(STAMP) bench-deps
	$(PY) bench/run_all.py

## bench-deps: the servers bench/bench_e2e.py compares against (Debian's redis-server, nats-server)
bench-deps:
	@if command -v redis-server >/dev/null && { command -v nats-server >/dev/null || test -x /usr/sbin/nats-server; }; then \
		echo "redis-server and nats-server are installed"; \
	else \
		SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
		$$SUDO apt-get update && $$SUDO apt-get install -y redis-server nats-server; \
	fi

## proto: regenerate services/fjord/_proto from proto/ (checked by tests/unit/test_proto_fresh.py)
proto: $(STAMP)
	$(PY) -m fjord.tools.genproto

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis
