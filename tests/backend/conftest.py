"""Fixtures of the backend tests: a tiny random Llama on disk, every backend kind, a local Ray cluster.

`make_backend` builds the backend under test from its kind:
* ``local``: `LocalBackend` on the CPU, in process;
* ``data_parallel``: `LocalBackend(devices=["cpu", "cpu"])`: two worker processes, a gloo group;
* ``ray``: `RayBackend` with two CPU workers on a two-node local Ray cluster (`ray.cluster_utils.Cluster`),
  one worker per node (STRICT_SPREAD).
"""

from __future__ import annotations

import os

import pytest

BACKENDS = ["local", "data_parallel", "ray"]


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """A tiny random Llama saved as a folder: every backend (and every worker process) loads it."""
    from groupwise.loading import tiny_random_model

    path = tmp_path_factory.mktemp("tiny-llama")
    model, tok = tiny_random_model(seed=0)
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return str(path)


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


def make_backend(kind: str, path, request, **kwargs):
    import groupwise as gw

    if kind == "local":
        return gw.LocalBackend(path=str(path), device="cpu", **kwargs)
    if kind == "data_parallel":
        return gw.LocalBackend(path=str(path), devices=["cpu", "cpu"], collective_timeout_s=60, **kwargs)
    if kind == "ray":
        request.getfixturevalue("ray_cluster")
        from groupwise.backend.ray import RayBackend

        return RayBackend(path=str(path), num_workers=2, use_gpu=False, cpus_per_worker=1,
                          placement_strategy="STRICT_SPREAD", collective_timeout_s=60, **kwargs)
    raise ValueError(kind)


async def sample_groups(model, n_groups=2, n=4, step=0, max_tokens=4):
    """Rollouts through the model's own client (real HTTP to the workers for the multi-worker backends)."""
    import asyncio

    import groupwise as gw

    client = model.openai_client()

    async def one(g, i):
        messages = [{"role": "user", "content": f"scenario {g}"}]
        r = await client.chat.completions.create(model=model.inference_name(), messages=messages,
                                                 max_tokens=max_tokens, seed=100 * step + 10 * g + i)
        return gw.Trajectory(messages_and_choices=[*messages, r.choices[0]], reward=float(i))

    groups = []
    for g in range(n_groups):
        groups.append(gw.TrajectoryGroup(await asyncio.gather(*(one(g, i) for i in range(n)))))
    return groups
