"""Fixtures of the backend tests: a local two-node Ray cluster (backend_helpers.py builds the backends;
the tiny model's folder is tests/conftest.py's `tiny_model_dir`)."""

from __future__ import annotations

import os

import pytest


@pytest.fixture(scope="session")
def ray_cluster():
    """Two Ray nodes of one CPU each, on this machine; the test process is the driver."""
    ray = pytest.importorskip("ray", reason="Ray is not installed (extra 'ray', part of 'dev')")
    from ray.cluster_utils import Cluster

    os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    cluster.add_node(num_cpus=1)
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, include_dashboard=False, log_to_driver=False)
    try:
        yield cluster
    finally:
        ray.shutdown()
        cluster.shutdown()
