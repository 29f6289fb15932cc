"""LocalBackend end to end on a tiny random model: serve, train, verify the swap, resume after SIGKILL."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import groupwise as gw
from groupwise.core.choices import choice_logprobs
from groupwise.errors import AdapterMismatchError, RunLockedError

HERE = Path(__file__).parent


async def _groups(model, n_groups=2, n=4, step=0, name=None):
    """Groups of rollouts sampled through the model's client, asking for `name` (default: the model)."""
    client = model.openai_client()
    groups = []
    for g in range(n_groups):
        trajs = []
        for i in range(n):
            messages = [{"role": "user", "content": f"scenario {g}"}]
            r = await client.chat.completions.create(model=name or model.inference_name(), messages=messages,
                                                     max_tokens=5, seed=100 * step + 10 * g + i)
            trajs.append(gw.Trajectory(messages_and_choices=[*messages, r.choices[0]], reward=float(i)))
        groups.append(gw.TrajectoryGroup(trajs))
    return groups


async def test_train_serves_and_verifies_the_new_adapter(tiny_model_dir, tmp_path):
    model = gw.TrainableModel(name="agent", project="p", base_model=tiny_model_dir)
    backend = gw.LocalBackend(path=str(tmp_path), best_checkpoint_metric=None)
    await model.register(backend)
    assert await model.get_step() == 0
    try:
        # its loopback HTTP server keeps `groupwise serve`'s head deadline: a connection whose request
        # head never ends is closed (uvicorn alone would hold it forever)
        port = int(model.inference_base_url.rsplit(":", 1)[1].split("/")[0])
        half_open = socket.create_connection(("127.0.0.1", port))
        half_open.sendall(f"POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1:{port}\r\n".encode())
        half_open.settimeout(60)
        try:
            assert half_open.recv(1024) == b""
        except ConnectionResetError:
            pass
        finally:
            half_open.close()
        groups = await _groups(model)
        # the model's client gets logprobs as one list (groupwise.core.choices.TOKEN_DATA_HEADER), which the
        # trainer reads (test_tokenize.py) and the store keeps (the lossless check below)
        choices = [t.messages_and_choices[-1] for g in groups for t in g.trajectories]
        assert all(c.logprobs is None and len(choice_logprobs(c)) == len(c.token_ids) for c in choices)
        result = await model.train(groups, config=gw.TrainConfig(learning_rate=1e-3), cursor={"scenario_index": 8})
        assert await backend.checkpoint_cursor(model) == {"scenario_index": 8}
        assert result.step == 1 and await model.get_step() == 1
        for key in ("loss", "kl", "grad_norm", "zero_variance_fraction", "trainable_tokens", "step_time"):
            assert key in result.metrics, key
        # the sampler's logprobs are what the trainer computes before its update: ratio 1 (fp32 CPU)
        assert result.metrics["ratio_mean"] == pytest.approx(1.0, abs=1e-4)
        r = await model.openai_client().chat.completions.create(
            model="agent", messages=[{"role": "user", "content": "hi"}], max_tokens=2)
        assert r.model == "agent@1"
        run = tmp_path / "p" / "models" / "agent"
        assert (run / "checkpoints" / "0001" / "state.json").is_file()
        # a second backend on this run folder is refused while this one writes it (before it loads) ...
        again = gw.LocalBackend(path=str(tmp_path))
        clone = gw.TrainableModel(name="agent", project="p", base_model=tiny_model_dir)
        with pytest.raises(RunLockedError, match="another backend of this same process"):
            await clone.register(again)
        # ... and once it is closed, a new backend (a restarted process) resumes step 1 and its cursor
        await backend.close()
        backend = again
        await clone.register(backend)
        assert await clone.get_step() == 1 and await backend.checkpoint_cursor(clone) == {"scenario_index": 8}
        assert gw.load_trajectories(run, "train", 0) == groups  # lossless, token ids included
        row = [r for r in gw.load_history(run) if r["split"] == "train"][-1]
        assert row["step"] == 0 and "loss" in row and "grad_norm" in row

        # A stale swap is caught: the engine keeps serving the old step.
        served = backend._worker.replicas["p/agent"]
        served.registry.add_step = lambda *a, **k: None
        # The error names the adapter as users do (name@step), not by peft's slot.
        with pytest.raises(AdapterMismatchError, match="the engine's 'p/agent@2' does not hold the trained weights"):
            await clone.train(await _groups(clone, step=1), config=gw.TrainConfig(learning_rate=1e-3))
        # the checkpoint, written while the engine was checked, is complete on disk
        assert (run / "checkpoints" / "0002" / "state.json").is_file()
        # ... and so is a registry that still resolves the model's name to the old step
        with pytest.raises(AdapterMismatchError, match="answers requests for 'p/agent' as 'p/agent@1'"):
            served.check_answers(2)
        served.check_answers(1)
    finally:
        await backend.close()


async def test_rollouts_and_training_run_their_torch_work_on_one_thread(tiny_model_dir, tmp_path):
    # groupwise/runtime/compute.py: a second thread running torch ops slowed every CPU op (OpenMP teams).
    import threading

    from groupwise.runtime.compute import compute_thread

    model = gw.TrainableModel(name="agent", project="p", base_model=tiny_model_dir)
    backend = gw.LocalBackend(path=str(tmp_path), best_checkpoint_metric=None)
    await model.register(backend)
    threads = set()
    served = backend._worker.replicas["p/agent"]
    decoder = served.peft_model.get_base_model().model  # both the engine and the trainer run it
    decoder.register_forward_pre_hook(lambda *a: threads.add(threading.current_thread()))
    try:
        groups = await _groups(model)  # engine forwards
        await model.train(groups, config=gw.TrainConfig(learning_rate=1e-3))  # trainer forwards
    finally:
        await backend.close()
    assert threads == {compute_thread()._thread}


def _worker(store, tiny_model_dir, steps, *extra):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(HERE), os.environ.get("PYTHONPATH")])),
               OMP_NUM_THREADS="1")
    return subprocess.Popen([sys.executable, str(HERE / "resume_worker.py"), str(store), tiny_model_dir, str(steps), *extra],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def _wait(proc, timeout=240):
    out, _ = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, out.decode()[-3000:]


def test_sigkill_mid_step_resumes_with_identical_optimizer(tiny_model_dir, tmp_path):
    straight, killed = tmp_path / "straight", tmp_path / "killed"
    # The reference: 2 uninterrupted steps.
    _wait(_worker(straight, tiny_model_dir, 2))
    # The same run, killed in the middle of the step 1 -> 2.
    proc = _worker(killed, tiny_model_dir, 2, "--hang-at-step", "1")
    deadline = time.time() + 240
    while not (killed / "in_step").exists():
        assert proc.poll() is None, proc.stdout.read().decode()[-3000:]
        assert time.time() < deadline, "the worker never reached step 1"
        time.sleep(0.2)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    run = killed / "resume" / "models" / "agent"
    # Everything written before the kill is readable: step 1's trajectories were written before training.
    assert [len(g) for g in gw.load_trajectories(run, "train", 1)] == [4, 4]
    assert [len(g) for g in gw.load_trajectories(run, "train", 0)] == [4, 4]
    assert [r["step"] for r in gw.load_history(run)] == [0]  # step 0's train row; step 1 never finished
    # step 1 is complete; step 2 never started saving
    assert sorted(p.name for p in (run / "checkpoints").iterdir() if p.name.isdigit()) == ["0001"]
    # Restart: resumes at step 1 with the optimizer the killed process held after step 1, bit for bit.
    _wait(_worker(killed, tiny_model_dir, 2))
    held = load_file(str(killed / "ref" / "1.safetensors"))
    resumed = load_file(str(killed / "ref" / "resumed-1.safetensors"))
    assert held.keys() == resumed.keys() and len(held) > 0
    assert all(torch.equal(held[k], resumed[k]) for k in held)
    # ... and ends where the uninterrupted run ended: same optimizer tensors and adapter after step 2.
    a = load_file(str(straight / "resume" / "models" / "agent" / "checkpoints" / "0002" / "optimizer.safetensors"))
    b = load_file(str(run / "checkpoints" / "0002" / "optimizer.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    wa = load_file(str(straight / "resume" / "models" / "agent" / "checkpoints" / "0002" / "adapter_model.safetensors"))
    wb = load_file(str(run / "checkpoints" / "0002" / "adapter_model.safetensors"))
    assert all(torch.equal(wa[k], wb[k]) for k in wa)


async def test_tools_and_multi_turn_train_on_what_was_sampled(tiny_model_dir, tmp_path):
    # SmolLM2's template has no tool support, so the server writes the tools into the system prompt;
    # the trainer renders the context the same way (the chat layer), so on a single turn the sampler's
    # logprobs equal the trainer's before the update: ratio 1.
    tools = [{"type": "function", "function": {"name": "lookup", "description": "look a word up",
                                               "parameters": {"type": "object", "properties": {"q": {"type": "string"}}}}}]
    model = gw.TrainableModel(name="agent", project="tools", base_model=tiny_model_dir)
    backend = gw.LocalBackend(path=str(tmp_path), best_checkpoint_metric=None)
    await model.register(backend)
    client = model.openai_client()

    async def rollout(i: int, turns: int) -> gw.Trajectory:
        items: list = [{"role": "user", "content": "first"}]
        for turn in range(turns):
            messages = [m if isinstance(m, dict) else {"role": "assistant", "content": m.message.content} for m in items]
            r = await client.chat.completions.create(model=model.inference_name(), messages=messages, tools=tools,
                                                     max_tokens=4, seed=10 * i + turn)
            items += [r.choices[0], {"role": "user", "content": "again"}]
        return gw.Trajectory(messages_and_choices=items[:-1], tools=tools, reward=float(i))

    try:
        single = [await rollout(i, 1) for i in range(4)]
        result = await model.train([gw.TrajectoryGroup(single)], config=gw.TrainConfig(learning_rate=1e-3))
        assert result.metrics["ratio_mean"] == pytest.approx(1.0, abs=1e-4)
        # Two turns: every Choice is trained, with its sampled ids. Turn 2 was sampled after the server
        # re-tokenised turn 1's TEXT (the OpenAI API carries no ids), while the trainer keeps turn 1's ids;
        # where a random token does not survive decode/encode the contexts differ and the importance
        # ratio departs slightly from 1 (the clip bounds it). Hence a looser bound here.
        double = [await rollout(i, 2) for i in range(4)]
        result = await model.train([gw.TrajectoryGroup(double)], config=gw.TrainConfig(learning_rate=1e-3))
        assert result.metrics["trainable_tokens"] == sum(len(c.token_ids) for t in double for c in t.choices())
        assert sum(len(t.choices()) for t in double) == 8
        assert result.metrics["ratio_mean"] == pytest.approx(1.0, abs=2e-2)
    finally:
        await backend.close()


async def test_lora_config_of_the_model_overrides_the_backend(tiny_model_dir, tmp_path):
    model = gw.TrainableModel(name="small", project="p", base_model=tiny_model_dir, config=gw.LoraConfig(rank=2, alpha=4))
    backend = gw.LocalBackend(path=str(tmp_path), lora=gw.LoraConfig(rank=16))
    await model.register(backend)
    try:
        peft_config = backend._worker.replicas["p/small"].peft_model.peft_config["default"]
        assert (peft_config.r, peft_config.lora_alpha) == (2, 4)
        assert model.run_dir == tmp_path / "p" / "models" / "small"  # the backend's path holds a default model's run
    finally:
        await backend.close()


async def test_each_step_is_written_once_with_its_checkpoint(tiny_model_dir, tmp_path, monkeypatch):
    # The backend stores a step's trajectories and train row with its checkpoint; model.train used to
    # write both again (the trajectories rewritten, the row replaced by a rewrite of the whole history).
    from groupwise.runs.store import RunStore

    written: list[tuple[str, int]] = []
    real_write = RunStore.write_trajectories

    def write_trajectories(self, split, step, groups):
        written.append((split, step))
        return real_write(self, split, step, groups)

    monkeypatch.setattr(RunStore, "write_trajectories", write_trajectories)
    model = gw.TrainableModel(name="once", project="p", base_model=tiny_model_dir)
    backend = gw.LocalBackend(path=str(tmp_path), best_checkpoint_metric=None)
    await model.register(backend)
    try:
        await model.train(await _groups(model), config=gw.TrainConfig(learning_rate=1e-3))
        inode = model.store.history_path.stat().st_ino
        await model.train_sft([g.trajectories[0] for g in await _groups(model, step=1)])
    finally:
        await backend.close()
    assert written == [("train", 0), ("sft", 1)]
    assert model.store.history_path.stat().st_ino == inode  # appended to, never rewritten
    rows = gw.load_history(model.run_dir)
    assert [(r["step"], r["split"]) for r in rows] == [(0, "train"), (1, "sft")]
    assert rows[0]["n_trajectories"] == 8 and rows[0]["loss"] == rows[0]["loss"]  # the row has the trainer's metrics
    assert "reward" not in rows[1] and rows[1]["updates"] == 1.0  # an SFT row: its metrics, no rollouts


async def test_a_runs_adapter_slots_are_made_when_it_registers(tiny_model_dir, tmp_path):
    # Adding a peft adapter walks every module and recaptures graphs on the thread every run's
    # rollouts step on: a run's slots (served_steps + 1) are made at register, and its steps add none.
    model = gw.TrainableModel(name="agent", project="p", base_model=tiny_model_dir)
    backend = gw.LocalBackend(path=str(tmp_path), best_checkpoint_metric=None, served_steps=1)
    try:
        await model.register(backend)
        engine = backend._worker.replicas["p/agent"].engine
        adapters = sorted(engine.model.peft_config)
        assert sum(a.startswith("gw-slot-") for a in adapters) == 2 == len(engine.runner.slots.free)
        for step in range(3):
            await model.train(await _groups(model, step=step), config=gw.TrainConfig(learning_rate=1e-3))
            assert sorted(engine.model.peft_config) == adapters  # served from the reserved slots
        assert await backend.served_steps(model) == [0, 3]
    finally:
        await backend.close()


async def test_steps_trained_on_the_base_models_samples_are_named_once(tiny_model_dir, tmp_path):
    """Rollouts that ask for the base (here ``agent@0``) instead of the model train on the base's samples
    every step, learning little with nothing saying why: from step 2 on, one warning names it. Rollouts
    that ask for the model (its latest step) never warn."""
    import warnings

    from groupwise.errors import GroupwiseWarning

    config = gw.TrainConfig(learning_rate=1e-3)
    backend = gw.LocalBackend(path=str(tmp_path), best_checkpoint_metric=None)
    good = gw.TrainableModel(name="good", project="p", base_model=tiny_model_dir)
    stuck = gw.TrainableModel(name="stuck", project="p", base_model=tiny_model_dir)
    try:
        for model in (good, stuck):
            await model.register(backend)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for step in range(4):
                await good.train(await _groups(good, step=step), config=config)
                await stuck.train(await _groups(stuck, step=step, name="stuck@0"), config=config)
    finally:
        await backend.close()
    named = [str(w.message) for w in caught if issubclass(w.category, GroupwiseWarning) and "base model" in str(w.message)]
    assert len(named) == 1 and named[0].startswith("stuck: step 2 trains on tokens the base model sampled"), named


async def test_a_step_with_ids_the_model_cannot_embed_is_refused_and_the_run_goes_on(tiny_model_dir, tmp_path):
    """One rollout's Choice from another model's server (an id past this model's embedding) is refused
    with the group and trajectory named, before anything reaches the model (on CUDA it would be a
    device-side assert that ends every run of the process); the run's next step trains as step 1."""
    model = gw.TrainableModel(name="agent", project="p", base_model=tiny_model_dir)
    backend = gw.LocalBackend(path=str(tmp_path), best_checkpoint_metric=None)
    await model.register(backend)
    try:
        groups = await _groups(model)
        vocab = backend._worker.replicas["p/agent"].peft_model.get_input_embeddings().num_embeddings
        forged = groups[1].trajectories[2].messages_and_choices[-1]
        forged.token_ids = [*forged.token_ids[:-1], vocab + 7]
        with pytest.raises(gw.GroupwiseError, match=rf"group 1, trajectory 2: a Choice has the token id {vocab + 7}, "
                                                    "outside the model's vocabulary"):
            await model.train(groups, config=gw.TrainConfig(learning_rate=1e-3))
        assert await model.get_step() == 0 and not (tmp_path / "p" / "models" / "agent" / "checkpoints" / "0001").exists()
        result = await model.train(await _groups(model, step=1), config=gw.TrainConfig(learning_rate=1e-3))
        assert result.step == 1 and await model.get_step() == 1
    finally:
        await backend.close()


async def test_a_run_resumed_on_other_base_weights_is_refused(tiny_model_dir, tmp_path):
    """A checkpoint records which base it was trained on; a run loaded on another base of the same shape
    (another seed, another fine-tune) would train its adapter and optimizer on on the wrong weights, silently."""
    from groupwise.errors import CheckpointMismatchError
    from groupwise.runtime.loading import tiny_random_model
    from groupwise.training.checkpoint import base_fingerprint

    other_dir = tmp_path / "tiny-seed-1"
    other, tok = tiny_random_model(seed=1)
    other.save_pretrained(other_dir)
    tok.save_pretrained(other_dir)
    same, _ = tiny_random_model(seed=0)
    assert base_fingerprint(same) == base_fingerprint(same.to(torch.bfloat16))  # any dtype of the same weights
    assert base_fingerprint(same) != base_fingerprint(other)

    model = gw.TrainableModel(name="agent", project="p", base_model=tiny_model_dir)
    backend = gw.LocalBackend(path=str(tmp_path / "runs"), best_checkpoint_metric=None)
    await model.register(backend)
    try:
        await model.train(await _groups(model), config=gw.TrainConfig(learning_rate=1e-3))
    finally:
        await backend.close()
    moved = gw.TrainableModel(name="agent", project="p", base_model=str(other_dir))
    backend = gw.LocalBackend(path=str(tmp_path / "runs"))
    try:
        with pytest.raises(CheckpointMismatchError, match=r"was trained on base model .*tiny-llama.*run_name"):
            await moved.register(backend)
    finally:
        await backend.close()
    again = gw.TrainableModel(name="agent", project="p", base_model=tiny_model_dir)  # the same base resumes
    backend = gw.LocalBackend(path=str(tmp_path / "runs"))
    try:
        await again.register(backend)
        assert await again.get_step() == 1
    finally:
        await backend.close()
