"""Fixtures of the inference tests: one tiny random Llama (SmolLM2's tokenizer), three random LoRA
adapters saved as peft folders, one engine + registry + app shared by the module's tests."""

from __future__ import annotations

import pytest
import torch

from groupwise.runtime.loading import tiny_random_model


def make_adapter(path, seed: int, scale: float = 20.0) -> str:
    """A peft LoRA folder with random (not zero) A and B, scaled so it visibly changes outputs."""
    from peft import LoraConfig, get_peft_model

    base, _ = tiny_random_model(seed=0)
    config = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "o_proj"], init_lora_weights=False)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        peft_model = get_peft_model(base, config)
        with torch.no_grad():
            for name, p in peft_model.named_parameters():
                if "lora_B" in name:
                    p.normal_(0.0, scale / p.shape[1] ** 0.5)
    peft_model.save_pretrained(str(path))
    return str(path)


@pytest.fixture(scope="session")
def tiny():
    return tiny_random_model(seed=0)


@pytest.fixture(scope="session")
def adapter_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("adapters")
    return {k: make_adapter(root / f"step{k}", seed=k) for k in (1, 2, 3)}


@pytest.fixture(scope="session")
def served(tiny, adapter_dirs):
    """(engine, registry, app): 'agent' served at steps 0 (base), 1 and 2; base alias 'tiny'."""
    from groupwise.inference.engine import Engine
    from groupwise.inference.registry import ModelRegistry
    from groupwise.inference.server import create_app

    model, tok = tiny_random_model(seed=0, tokenizer=tiny[1])  # own copy: adapters wrap it
    engine = Engine(model, tok, max_batch_size=32, max_new_tokens_default=32)
    registry = ModelRegistry(engine, base_name="tiny")
    registry.register_model("agent")
    for step in (1, 2):
        path = adapter_dirs[step]
        registry.add_step("agent", step, path)
    yield engine, registry, create_app(registry)
    engine.close()


@pytest.fixture
async def client(served):
    from groupwise.inference.client import in_process_client

    c = in_process_client(served[2])
    yield c
    await c.close()


@pytest.fixture
async def live(served):
    """The shared app ('agent' at steps 0-2, alias 'tiny') over real HTTP on loopback."""
    from live_server import LiveServer

    async with LiveServer(served[2]) as server:
        yield server
