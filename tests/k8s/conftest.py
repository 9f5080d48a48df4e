"""``real_kube``: one real Kubernetes control plane (kube-apiserver and kube-controller-manager
1.20, tests/k8s/kube/apiserver.py) per test session, on the session etcd, with the chart's CRDs
installed by kubectl (their CEL rule dropped: 1.20 has no CEL). Without the binaries the tests
that use it fail naming `make kube`."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from fjord.local.etcd import EtcdProcess
from tests.k8s.crd_validation import CHART_DIR
from tests.k8s.kube.apiserver import KubeMissing, RealKube, missing_binaries


@pytest.fixture(scope="session")
def real_kube(etcd: EtcdProcess, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealKube]:
    missing = missing_binaries()
    if missing:
        pytest.fail(
            f"{', '.join(missing)} not built: run `make kube` (Kubernetes 1.20 from Debian's "
            "source package into .cache/kube; `make test` does it first)"
        )
    kube = RealKube(tmp_path_factory.mktemp("kube"), etcd.url)
    try:
        kube.start(crd_dir=CHART_DIR / "crds")
    except KubeMissing as exc:
        kube.stop()
        pytest.fail(str(exc))
    except BaseException:
        kube.stop()
        raise
    try:
        yield kube
    finally:
        kube.stop()
