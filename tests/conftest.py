"""Fixtures every test folder shares: the tiny random model saved as a folder (built once per session),
a counter of the reads of a run's history file, and a record of torch's cuDNN attention switch at
each attention call.

One home for them: each folder used to build the same model (`tiny_random_model(seed=0)`: a 2-layer
Llama with SmolLM2's tokenizer) into its own folder. Tests only read the folder (backends load it as
they would a Hugging Face id, worker processes load it again), so one copy serves them all.
"""

from __future__ import annotations

import io
import os

import pytest

# A developer's W&B key must not make every test that logs a step open a W&B run (a Model logs to W&B
# when WANDB_API_KEY is set, as ART's: groupwise.runs.wandb_log); the W&B tests set offline mode themselves.
os.environ.pop("WANDB_API_KEY", None)
if os.environ.get("WANDB_MODE", "").lower() in ("offline", "dryrun", "online", "run"):
    os.environ["WANDB_MODE"] = "disabled"


# Under pytest-xdist (CI runs `-n 2` on its 2 cores: pyproject's addopts) each worker takes its share of the
# cores: torch's default of one thread per core in every worker would oversubscribe them. Set before any test
# imports torch, and inherited by the processes tests start.
if os.environ.get("PYTEST_XDIST_WORKER"):
    _threads = max(1, (os.cpu_count() or 1) // int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")))
    for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(_var, str(_threads))


# A test that runs test files in a pytest of their own, in another environment's Python (tests/envs/
# test_verifiers_hub.py, test_openenv_versions.py), names its own folder of the tiny model here, so that run
# reads it rather than building it again.
TINY_MODEL_ENV = "GROUPWISE_TEST_TINY_MODEL_DIR"


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> str:
    """The tiny random Llama (seed 0, SmolLM2's tokenizer) saved as a folder; never write into it."""
    from groupwise.runtime.loading import tiny_random_model

    if os.environ.get(TINY_MODEL_ENV):
        return os.environ[TINY_MODEL_ENV]
    path = tmp_path_factory.mktemp("tiny-llama")
    model, tok = tiny_random_model(seed=0)
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return str(path)


@pytest.fixture(scope="session")
def tiny_model_env(tiny_model_dir) -> dict[str, str]:
    """The environment entry that makes a nested pytest run's `tiny_model_dir` this session's folder."""
    return {TINY_MODEL_ENV: tiny_model_dir}


@pytest.fixture(scope="session")
def peaked_tiny_model(tmp_path_factory) -> str:
    """The tiny random model with its final norm scaled x10, saved as a folder: its next-token
    distribution is peaked (entropy ~7 nats instead of ~10.8, near uniform over 49k tokens). A random
    model's logits are so flat that GRPO has no competing alternatives to learn from in a few steps."""
    import torch

    from groupwise.runtime.loading import tiny_random_model

    path = tmp_path_factory.mktemp("tiny-peaked")
    model, tok = tiny_random_model(seed=0)
    with torch.no_grad():
        model.model.norm.weight.mul_(10.0)
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return str(path)


@pytest.fixture
def reads(monkeypatch) -> list[str]:
    """Every open of a history.jsonl for reading, counted (builtins.open and Path.open both end in io.open):
    what the run history's tests count to show a run never rereads its file."""
    opened: list[str] = []
    real_open = io.open

    def counting_open(file, mode="r", *args, **kwargs):
        if str(file).endswith("history.jsonl") and not any(c in mode for c in "wax+"):
            opened.append(str(file))
        return real_open(file, mode, *args, **kwargs)

    monkeypatch.setattr(io, "open", counting_open)
    monkeypatch.setattr("builtins.open", counting_open)
    return opened


@pytest.fixture
def cudnn_attention_at_each_call(monkeypatch) -> list[bool]:
    """Whether cuDNN's SDPA kernel was switched on at each `scaled_dot_product_attention` call (the
    engine's and the trainer's passes switch it off: groupwise/runtime/attention_backends.py)."""
    import torch

    seen: list[bool] = []
    real = torch.nn.functional.scaled_dot_product_attention

    def recording(*args, **kwargs):
        seen.append(torch.backends.cuda.cudnn_sdp_enabled())
        return real(*args, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", recording)
    return seen


# Known failures, each reported as xfail with its reason (never as a pass) until its fix lands.
KNOWN_BROKEN = {
}


# The files that take minutes on the 2-core CI machine (pytest --durations), scheduled first: with `--dist
# loadfile` a file runs whole on one worker, and one of minutes started last leaves the other worker idle
# at the end of the suite. Only these few move: the other files keep their order (pyproject's addopts turn
# off xdist's own reorder, by number of tests, which put these files of one or two long tests last), so the
# long files of several processes each mostly run beside short ones rather than beside each other. Order
# only: every test runs.
LONGEST_FILES = (
    "tests/envs/test_verifiers_hub.py",  # two training runs in environments of their own (~220 s)
    "tests/backend/test_contract.py",  # one lifecycle on each backend, Ray's local cluster included (~130 s)
    "tests/jobs/test_train_processes.py",  # sweeps of a process per run, one killed, one interrupted (~130 s)
)


def pytest_collection_modifyitems(config, items):
    for item in items:
        reason = KNOWN_BROKEN.get(item.nodeid)
        if reason is not None:
            item.add_marker(pytest.mark.xfail(reason=reason, strict=False))
    gone = [name for name in LONGEST_FILES if not (config.rootpath / name).is_file()]
    if gone:  # a renamed file would silently go back to its place in the queue
        raise pytest.UsageError(f"tests/conftest.py's LONGEST_FILES names files that are gone: {gone}")
    rank = {name: i for i, name in enumerate(LONGEST_FILES)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::")[0], len(LONGEST_FILES)))  # stable: files keep their order
