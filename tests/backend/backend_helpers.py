"""Builders shared by the backend tests: every backend kind, and rollouts through a model's own client.

`make_backend` builds the backend under test from its kind:
* ``local``: `LocalBackend` on the CPU, in process;
* ``data_parallel``: `LocalBackend(devices=["cpu", "cpu"])`: two worker processes, a gloo group;
* ``separate``: `LocalBackend(device="cpu", engine_process="separate")`: one worker process holds the model,
  engine and trainer and serves the engine as an engine core; the test's process is its frontend;
* ``ray``: `RayBackend` with two CPU workers on a two-node local Ray cluster (`ray.cluster_utils.Cluster`),
  one worker per node (STRICT_SPREAD).
"""

from __future__ import annotations

BACKENDS = ["local", "data_parallel", "separate", "ray"]


def make_backend(kind: str, path, request, **kwargs):
    import groupwise as gw

    if kind == "local":
        return gw.LocalBackend(path=str(path), device="cpu", **kwargs)
    if kind == "separate":
        return gw.LocalBackend(path=str(path), device="cpu", engine_process="separate", **kwargs)
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


def checkpoint_steps(model) -> list[int]:
    """The steps whose checkpoint folders are on disk (what retention left), ascending."""
    return sorted(int(p.name) for p in model.store.checkpoints_dir.iterdir() if p.name.isdigit())


async def ask(client, name: str) -> str:
    """Which adapter answers `name`: the canonical name@step the server answers with (greedy, 2 tokens)."""
    r = await client.chat.completions.create(model=name, messages=[{"role": "user", "content": "hi"}],
                                             max_tokens=2, temperature=0.0)
    return r.model
