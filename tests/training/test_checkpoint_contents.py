"""A non-finite step is undone and never checkpointed; a checkpoint is resumed from only when what it
holds is usable (finite adapter and optimizer state, RNG and optimizer state of the right shape, the
step of its folder); a save that runs out of disk removes its partial folder and says the disk is full."""

from __future__ import annotations

import errno
import hashlib
import json
import math
import warnings

import pytest
import torch
from gw_train_helpers import lora_model

from groupwise.config import TrainConfig
from groupwise.errors import CheckpointError, DiskFullError, GroupwiseError, GroupwiseWarning, NonFiniteError
from groupwise.training import checkpoint as ckpt
from groupwise.training.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint
from groupwise.training.tokenize import TokenizedBatch, TokenizedSequence
from groupwise.training.trainer import Trainer


def _batch(advantages=(1.0, -1.0, 0.5, -0.5)):
    gen = torch.Generator().manual_seed(2)
    seqs = []
    for b, adv in enumerate(advantages):
        n = 16
        ids = torch.randint(3, 1000, (n,), generator=gen).tolist()
        mask = [t >= n // 2 for t in range(n)]
        old = [-3.0 if m else math.nan for m in mask]
        seqs.append(TokenizedSequence(ids, mask, old, advantage=adv, trajectory_index=b))
    return TokenizedBatch(sequences=seqs, num_groups=1)


def _state(trainer):
    params = {n: p.detach().clone() for n, p in trainer.trainable_named_parameters()}
    opt = {id(p): {k: v.clone() for k, v in s.items()} for p, s in trainer.optimizer.state.items()}
    return params, opt


def _assert_same(trainer, before):
    params, opt = _state(trainer)
    assert params.keys() == before[0].keys()
    assert all(torch.equal(params[n], before[0][n]) for n in params)
    assert opt.keys() == before[1].keys()
    assert all(torch.equal(opt[i][k], before[1][i][k]) for i in opt for k in opt[i])


@pytest.mark.parametrize("dtype, lr, problem", [
    # 1e39 is a finite float (the config accepts it) but overflows fp32: AdamW raises part-way
    (torch.float32, 1e39, "the optimizer step overflowed"),
    # in fp64 the step size lr / (1 - beta1**t) overflows to inf: the update writes inf/nan
    (torch.float64, 1e308, r"the optimizer step made \d+ of the adapter's \d+ tensors nan or inf"),
])
def test_an_update_that_overflows_the_adapter_is_undone_and_names_the_learning_rate(tokenizer, dtype, lr, problem):
    trainer = Trainer(lora_model(tokenizer, dtype=dtype))
    trainer.train_step(_batch(), TrainConfig(learning_rate=1e-3), step=0)  # AdamW has moments to corrupt
    before = _state(trainer)
    with pytest.raises(NonFiniteError, match=f"step 1: {problem}") as err:
        trainer.train_step(_batch(), TrainConfig(learning_rate=lr), step=1)
    assert isinstance(err.value, GroupwiseError) and isinstance(err.value, FloatingPointError)
    assert f"learning_rate={lr!r}" in str(err.value) and "nothing was checkpointed" in str(err.value)
    _assert_same(trainer, before)  # adapter and AdamW moments as before the step
    metrics = trainer.train_step(_batch(), TrainConfig(learning_rate=1e-3), step=1)  # and training goes on
    assert math.isfinite(metrics["loss"])
    assert all(bool(torch.isfinite(p).all()) for _, p in trainer.trainable_named_parameters())


def test_a_nan_loss_fails_the_step_before_any_update(tokenizer):
    trainer = Trainer(lora_model(tokenizer, dtype=torch.float32))
    trainer.train_step(_batch(), TrainConfig(learning_rate=1e-3), step=0)
    before = _state(trainer)
    with pytest.raises(NonFiniteError, match="step 4: the loss is nan"):
        trainer.train_step(_batch(advantages=(1.0, math.nan, 0.5, -0.5)), TrainConfig(), step=4)
    _assert_same(trainer, before)


def test_a_nan_loss_is_named_first_when_the_step_it_feeds_also_overflows(tokenizer):
    # the loss is read back after the step was taken (one read-back): the step that failed on its own
    # overflow is undone, and the cause named is the loss, as when the loss was checked first
    trainer = Trainer(lora_model(tokenizer, dtype=torch.float32))
    trainer.train_step(_batch(), TrainConfig(learning_rate=1e-3), step=0)
    before = _state(trainer)
    with pytest.raises(NonFiniteError, match="step 2: the loss is nan"):
        trainer.train_step(_batch(advantages=(1.0, math.nan, 0.5, -0.5)), TrainConfig(learning_rate=1e39), step=2)
    _assert_same(trainer, before)


@pytest.mark.parametrize("max_grad_norm", [0.0, 1e-4, 1e3])
def test_the_step_taken_before_the_read_back_is_the_step_of_clipping_then_stepping(tokenizer, max_grad_norm):
    # the gradient norm, its clipping and AdamW's update equal those of the read-back-first order
    from groupwise.training.finite import guarded_step

    trainer = Trainer(lora_model(tokenizer, dtype=torch.float32))
    trainer.train_step(_batch(), TrainConfig(learning_rate=1e-3), step=0)  # AdamW with moments
    config = TrainConfig(learning_rate=1e-3, max_grad_norm=max_grad_norm)
    params, optimizer = trainer.begin_update(config)
    try:
        sums, _ = trainer._accumulate(_batch(advantages=(0.5, -1.0, 1.0, -0.5)), config, objective="grpo", totals=None,
                                      progress=None)
        named = trainer.trainable_named_parameters()
        grads = [p.grad.clone() for p in params]
        start = [p.detach().clone() for p in params]
        moments = {i: {k: v.clone() for k, v in optimizer.state[p].items()} for i, p in enumerate(params)}
        max_norm = max_grad_norm if max_grad_norm > 0 else math.inf
        norm, read = guarded_step(named, optimizer, step=1, config=config, max_norm=max_norm, sums=sums)
        stepped = [p.detach().clone() for p in params]
        # the reference: the norm read first, the gradient clipped, then the step, from the same state
        with torch.no_grad():
            for p, x, g in zip(params, start, grads):
                p.copy_(x)
                p.grad = g.clone()
        for i, p in enumerate(params):
            optimizer.state[p] = {k: v.clone() for k, v in moments[i].items()}
        expected_norm = float(torch.nn.utils.clip_grad_norm_(params, max_norm))
        optimizer.step()
    finally:
        trainer.end_update(optimizer)
    assert read == pytest.approx(sums.tolist()) and math.isfinite(read[0])
    assert norm == expected_norm > 0
    assert all(torch.equal(a, p.detach()) for a, p in zip(stepped, params))
    assert any(not torch.equal(a, x) for a, x in zip(stepped, start))  # it moved


@pytest.fixture
def saved(tokenizer, tmp_path):
    """Checkpoints 1 and 2 of a trained adapter; returns (trainer, names, root)."""
    trainer = Trainer(lora_model(tokenizer, dtype=torch.float32))
    names = [n for n, _ in trainer.trainable_named_parameters()]
    for step in (1, 2):
        trainer.train_step(_batch(), TrainConfig(learning_rate=1e-3), step=step)
        save_checkpoint(tmp_path, step, model=trainer.model, optimizer=trainer.optimizer, param_names=names,
                        history=[{"step": step - 1, "split": "train"}])
    return trainer, names, tmp_path


def _rewrite(folder, name, data: bytes) -> None:
    """Replace a checkpoint file and record its new size and hash: a checkpoint whose hashes are
    consistent with bad contents (a diverged step saved before the finiteness check, an edit)."""
    (folder / name).write_bytes(data)
    state = json.loads((folder / "state.json").read_text())
    state["files"][name] = {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    (folder / "state.json").write_text(json.dumps(state))


def _resumes_from_step_1(root, problem):
    with pytest.warns(GroupwiseWarning, match=rf"0002 is corrupt \({problem}"):
        state = latest_checkpoint(root)
    assert state.step == 1 and state.history == [{"step": 0, "split": "train"}]
    return state


@pytest.mark.parametrize("cores", [2, 16])
def test_state_json_records_each_file_as_it_is_on_disk(saved, monkeypatch, cores):
    # the tensor files are hashed while they are written (one after another on two cores, side by side on
    # more): what is recorded is what a resume reads back, for every file of the folder but state.json
    trainer, names, root = saved
    monkeypatch.setattr(ckpt, "usable_cores", lambda: cores)
    folder = save_checkpoint(root, 3, model=trainer.model, optimizer=trainer.optimizer, param_names=names)
    files = json.loads((folder / "state.json").read_text())["files"]
    assert set(files) == {p.name for p in folder.iterdir()} - {"state.json"} == {
        "adapter_model.safetensors", "adapter_config.json", "optimizer.safetensors", "optimizer.json",
        "rng.safetensors", "rng.json"}
    for name, recorded in files.items():
        data = (folder / name).read_bytes()
        assert recorded == {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}, name
    assert ckpt.verify_checkpoint(ckpt.read_state(folder)) is None


def test_a_non_finite_adapter_is_never_written(saved):
    trainer, names, root = saved
    with torch.no_grad():
        trainer.trainable_named_parameters()[3][1][0, 0] = math.nan
    with pytest.raises(NonFiniteError, match=r"step 3 was not checkpointed: 1 of the adapter's \d+ tensors"):
        save_checkpoint(root, 3, model=trainer.model, optimizer=trainer.optimizer, param_names=names)
    assert sorted(p.name for p in root.iterdir()) == ["0001", "0002"]


def test_a_nan_adapter_with_matching_hashes_is_skipped_and_the_run_resumes_before_it(saved):
    from safetensors.torch import load_file, save

    trainer, names, root = saved
    weights = load_file(str(root / "0002" / "adapter_model.safetensors"))
    weights = {k: torch.full_like(v, math.nan) if i % 2 else v for i, (k, v) in enumerate(sorted(weights.items()))}
    _rewrite(root / "0002", "adapter_model.safetensors", save(weights))
    state = _resumes_from_step_1(root, r"its adapter holds nan or inf in \d+ of \d+ tensors")
    load_checkpoint(state, model=trainer.model, optimizer=trainer.optimizer, param_names=names)
    assert all(bool(torch.isfinite(p).all()) for _, p in trainer.trainable_named_parameters())


def test_a_nan_optimizer_state_is_skipped(saved):
    from safetensors.torch import load_file, save

    _, _, root = saved
    moments = load_file(str(root / "0002" / "optimizer.safetensors"))
    key = next(k for k in moments if k.endswith("::exp_avg"))
    moments[key] = torch.full_like(moments[key], math.inf)
    _rewrite(root / "0002", "optimizer.safetensors", save(moments))
    _resumes_from_step_1(root, r"its optimizer state holds nan or inf in 1 of")


@pytest.mark.parametrize("python", [[3, 7, None], "not a state", [3, list(range(624)), None, "extra"]])
def test_an_rng_state_of_the_wrong_shape_is_skipped_instead_of_crashing_the_resume(saved, python):
    trainer, names, root = saved
    meta = json.loads((root / "0002" / "rng.json").read_text())
    meta["python"] = python
    _rewrite(root / "0002", "rng.json", json.dumps(meta).encode())
    state = _resumes_from_step_1(root, "its RNG state cannot be restored")
    load_checkpoint(state, model=trainer.model, optimizer=trainer.optimizer, param_names=names)
    # loading that checkpoint anyway names it instead of raising a bare TypeError
    bad = ckpt.read_state(root / "0002")
    with pytest.raises(CheckpointError, match="0002 cannot be loaded"):
        load_checkpoint(bad, model=trainer.model, optimizer=trainer.optimizer, param_names=names)


def test_an_optimizer_state_of_the_wrong_shape_is_skipped(saved):
    _, _, root = saved
    meta = json.loads((root / "0002" / "optimizer.json").read_text())
    meta["param_groups"] = [{"lr": 1e-3, "params": 7}]
    _rewrite(root / "0002", "optimizer.json", json.dumps(meta).encode())
    _resumes_from_step_1(root, "optimizer.json has no list of param_groups")


def test_a_state_whose_step_disagrees_with_its_folder_is_skipped(saved):
    _, _, root = saved
    state = json.loads((root / "0002" / "state.json").read_text())
    state["step"] = 7
    (root / "0002" / "state.json").write_text(json.dumps(state))
    with pytest.warns(GroupwiseWarning, match="0002 is corrupt \\(state.json says step 7 but the folder is 0002"):
        assert latest_checkpoint(root).step == 1


@pytest.mark.parametrize("name", ["\u00b2", "\u0663", "\uff12"])
def test_a_checkpoint_folder_named_with_other_digits_is_not_a_step(saved, name):
    # str.isdigit() takes "²" (which int() refuses: every resume crashed with a ValueError) and "٣" / "２"
    # (which int() reads as 3 and 2: a folder copied under such a name counted as a second step). Only
    # ASCII digits name a step, here and in the store's checkpoint listing.
    import shutil

    from groupwise.runs.store import checkpoint_folders

    _, _, root = saved
    shutil.copytree(root / "0002", root / name)
    assert [s.step for s in ckpt.list_checkpoints(root)] == [1, 2]
    assert latest_checkpoint(root).path == root / "0002"
    assert [step for step, _ in checkpoint_folders(root)] == [1, 2]


def _full_disk(*args, **kwargs):
    raise OSError(errno.ENOSPC, "No space left on device")


def _full_disk_rust(*args, **kwargs):
    from safetensors import SafetensorError

    raise SafetensorError('Error while serializing: IoError(Os { code: 28, kind: StorageFull, '
                          'message: "No space left on device" })')


@pytest.mark.parametrize("writer", [_full_disk, _full_disk_rust])
def test_a_full_disk_leaves_no_partial_folder_and_says_so(saved, monkeypatch, writer):
    trainer, names, root = saved
    monkeypatch.setattr(ckpt, "save_tensors", writer)  # the optimizer and RNG tensors' writer
    with pytest.raises(DiskFullError) as err:
        save_checkpoint(root, 3, model=trainer.model, optimizer=trainer.optimizer, param_names=names)
    assert isinstance(err.value, CheckpointError) and isinstance(err.value, GroupwiseError)
    assert f"could not be written to {root}: the disk is full" in str(err.value)
    assert sorted(p.name for p in root.iterdir()) == ["0001", "0002"]  # no .tmp-3-<pid>
    assert latest_checkpoint(root).step == 2


def test_a_pruned_checkpoint_is_renamed_away_at_once_and_its_files_removed_by_the_sweep(saved):
    """Retention ends a checkpoint with one rename (`.deleted-*`, which no listing reads or warns about) and
    removes its files then or later (`sweep=False`: the worker sweeps off the step's path); a sweep also
    removes what a stopped process left."""
    from groupwise.training.checkpoint import list_checkpoints, prune_checkpoints, sweep_deleted

    trainer, names, tmp_path = saved
    save_checkpoint(tmp_path, 3, model=trainer.model, optimizer=trainer.optimizer, param_names=names)
    (tmp_path / ".deleted-0007-1").mkdir()  # a stopped process's, half removed
    (tmp_path / ".deleted-0007-1" / "state.json").write_text("{}")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the trash is not an unfinished checkpoint
        assert prune_checkpoints(tmp_path, keep_top=0, keep_recent=1, sweep=False) == [1, 2]
        assert [s.step for s in list_checkpoints(tmp_path)] == [3]
    assert sorted(p.name.split("-")[1] for p in tmp_path.iterdir() if p.name.startswith(".deleted-")) == \
        ["0001", "0002", "0007"]
    sweep_deleted(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["0003"]
    sweep_deleted(tmp_path / "missing")  # nothing to sweep: no error


def test_a_checkpoint_that_cannot_be_moved_is_kept_and_not_reported_deleted(saved, monkeypatch):
    from groupwise.training import checkpoint
    from groupwise.training.checkpoint import prune_checkpoints

    tmp_path = saved[2]

    def refused(src, dst):
        raise PermissionError(13, "Permission denied", str(src))

    monkeypatch.setattr(checkpoint.os, "replace", refused)
    with pytest.warns(GroupwiseWarning, match="0001 was to be deleted .* could not be moved .*it is kept"):
        assert prune_checkpoints(tmp_path, keep_recent=0, keep_top=0) == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["0001", "0002"]


def test_a_step_saved_again_replaces_its_folder_and_leaves_nothing_aside(saved, monkeypatch):
    """A step checkpointed again (a restart redoing it) replaces its folder whole; the old one is moved aside as
    retention moves a deleted checkpoint, so one a stopped process left is removed by the next sweep."""
    from groupwise.training import checkpoint
    from groupwise.training.checkpoint import list_checkpoints, sweep_deleted

    trainer, names, root = saved
    save_checkpoint(root, 2, model=trainer.model, optimizer=trainer.optimizer, param_names=names, metrics={"m": 7.0})
    assert sorted(p.name for p in root.iterdir()) == ["0001", "0002"]
    assert list_checkpoints(root)[-1].metrics == {"m": 7.0}
    monkeypatch.setattr(checkpoint.shutil, "rmtree", lambda *a, **k: None)  # stopped before the old folder went
    save_checkpoint(root, 2, model=trainer.model, optimizer=trainer.optimizer, param_names=names, metrics={"m": 8.0})
    monkeypatch.undo()
    assert [p.name[:len(".deleted-0002")] for p in root.iterdir() if p.name.startswith(".")] == [".deleted-0002"]
    sweep_deleted(root)
    assert sorted(p.name for p in root.iterdir()) == ["0001", "0002"]
    assert list_checkpoints(root)[-1].metrics == {"m": 8.0}
