"""A checkpoint's files are checked against the sizes and hashes saved with it: a corrupt one is
skipped with a warning naming it, and a load that fails names the checkpoint."""

from __future__ import annotations

import json

import pytest

from groupwise.errors import CheckpointError, GroupwiseWarning
from groupwise.training.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint, verify_checkpoint


@pytest.fixture
def peft_and_optimizer(tiny_model):
    import torch
    from peft import LoraConfig, get_peft_model

    model = get_peft_model(tiny_model, LoraConfig(r=2, target_modules=["q_proj"]))
    params = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    opt = torch.optim.AdamW([p for _, p in params], lr=1e-3)
    model(torch.tensor([[1, 2, 3]])).logits.sum().backward()
    opt.step()
    return model, opt, [n for n, _ in params]


def _save(root, step, peft_and_optimizer, **kw):
    model, opt, names = peft_and_optimizer
    return save_checkpoint(root, step, model=model, optimizer=opt, param_names=names, **kw)


def test_corrupt_latest_is_skipped_with_a_warning_naming_it(tmp_path, peft_and_optimizer):
    _save(tmp_path, 1, peft_and_optimizer, history=[{"step": 0, "split": "train", "reward": 1.0}])
    second = _save(tmp_path, 2, peft_and_optimizer)
    assert latest_checkpoint(tmp_path).step == 2 and verify_checkpoint(latest_checkpoint(tmp_path)) is None
    data = bytearray((second / "optimizer.safetensors").read_bytes())
    data[-1] ^= 0xFF  # one flipped bit, same size
    (second / "optimizer.safetensors").write_bytes(bytes(data))
    with pytest.warns(GroupwiseWarning, match=r"0002 is corrupt \(optimizer.safetensors differs from what was saved"):
        state = latest_checkpoint(tmp_path)
    assert state.step == 1 and state.history == [{"step": 0, "split": "train", "reward": 1.0}]
    (second / "adapter_config.json").unlink()
    with pytest.warns(GroupwiseWarning, match="adapter_config.json is missing"):
        assert latest_checkpoint(tmp_path).step == 1


def test_a_checkpoint_without_recorded_hashes_is_checked_by_reading_it(tmp_path, peft_and_optimizer):
    path = _save(tmp_path, 1, peft_and_optimizer)
    state_file = path / "state.json"
    state = json.loads(state_file.read_text())
    state["files"] = list(state["files"])  # as saved before sizes and hashes were recorded
    state_file.write_text(json.dumps(state))
    assert verify_checkpoint(latest_checkpoint(tmp_path, verify=False)) is None
    adapter = path / "adapter_model.safetensors"
    adapter.write_bytes(adapter.read_bytes()[:-10])
    problem = verify_checkpoint(latest_checkpoint(tmp_path, verify=False))
    assert problem.startswith("adapter_model.safetensors cannot be read")


def test_a_failing_load_names_the_checkpoint(tmp_path, peft_and_optimizer):
    model, opt, names = peft_and_optimizer
    path = _save(tmp_path, 1, peft_and_optimizer)
    (path / "adapter_model.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(CheckpointError, match=f"checkpoint {path} cannot be loaded"):
        load_checkpoint(latest_checkpoint(tmp_path, verify=False), model=model, optimizer=opt, param_names=names)


def test_a_snapshot_is_written_as_taken_even_after_the_model_moves_on(tmp_path, peft_and_optimizer):
    # The backend writes a step's files on another thread from a snapshot (backend/worker.py): an
    # update after the snapshot, on a CPU model whose tensors are not copied by a device move, must
    # not reach the files; they equal save_checkpoint's and peft's own save_pretrained's.
    import torch
    from safetensors.torch import load_file

    from groupwise.training.checkpoint import snapshot_checkpoint, write_checkpoint

    model, opt, names = peft_and_optimizer
    reference = _save(tmp_path / "ref", 1, peft_and_optimizer)
    model.save_pretrained(str(tmp_path / "peft"))
    snap = snapshot_checkpoint(1, model=model, optimizer=opt, param_names=names)
    model(torch.tensor([[4, 5, 6]])).logits.sum().backward()
    opt.step()  # the adapter and the optimizer state move on
    written = write_checkpoint(tmp_path / "snap", snap)
    for name in ("adapter_model.safetensors", "optimizer.safetensors"):
        got, want = load_file(str(written / name)), load_file(str(reference / name))
        assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want)
    peft_saved = load_file(str(tmp_path / "peft" / "adapter_model.safetensors"))
    got = load_file(str(written / "adapter_model.safetensors"))
    assert got.keys() == peft_saved.keys() and all(torch.equal(got[k], peft_saved[k]) for k in got)
    model.save_pretrained(str(tmp_path / "moved"))
    moved = load_file(str(tmp_path / "moved" / "adapter_model.safetensors"))
    assert not all(torch.equal(got[k], moved[k]) for k in got)  # the update did change the adapter
    config = json.loads((written / "adapter_config.json").read_text())
    assert config == {**json.loads((tmp_path / "peft" / "adapter_config.json").read_text()), "inference_mode": True}
    assert verify_checkpoint(latest_checkpoint(tmp_path / "snap")) is None


def test_the_trainers_kept_adapter_state_is_peft_state_dict_across_adapter_sets(tmp_path, tiny_model):
    # Trainer.adapter_state keeps peft's key -> parameter map instead of peft's walk each step: it must
    # give peft's keys and the live values after an update, follow a change of the model's adapters
    # (another run's adapter added), and a snapshot taken with it must write the same files.
    import torch
    from peft import get_peft_model_state_dict
    from safetensors.torch import load_file

    from groupwise.config import LoraConfig
    from groupwise.training.adapters import add_lora_adapter, wrap_with_lora
    from groupwise.training.checkpoint import snapshot_checkpoint, write_checkpoint
    from groupwise.training.trainer import Trainer

    model = wrap_with_lora(tiny_model, LoraConfig(rank=4, alpha=8))
    trainer = Trainer(model)

    def check() -> None:
        want = get_peft_model_state_dict(model, adapter_name=trainer.adapter_name)
        got = trainer.adapter_state()
        assert got.keys() == want.keys()
        assert all(got[k].data_ptr() == want[k].data_ptr() and torch.equal(got[k], want[k]) for k in want)

    check()
    first = trainer.adapter_state()
    with torch.no_grad():
        for _, p in trainer.trainable_named_parameters():
            p.add_(0.5)  # an update writes into the same tensors
    check()
    add_lora_adapter(model, LoraConfig(rank=4, alpha=8, seed=1), "other-run")
    check()
    assert trainer.adapter_state().keys() == first.keys()
    names = [n for n, _ in trainer.trainable_named_parameters()]
    kept = write_checkpoint(tmp_path / "kept", snapshot_checkpoint(1, model=model, optimizer=None, param_names=names,
                                                                   state=trainer.adapter_state()))
    walked = write_checkpoint(tmp_path / "walked", snapshot_checkpoint(1, model=model, optimizer=None, param_names=names))
    a, b = (load_file(str(p / "adapter_model.safetensors")) for p in (kept, walked))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
