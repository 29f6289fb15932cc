"""Fixtures of the training tests: SmolLM2's real tokenizer and a tiny random Llama."""

from __future__ import annotations

import pytest

@pytest.fixture(scope="session")
def tokenizer():
    from groupwise.runtime.loading import load_tokenizer

    return load_tokenizer("smollm2-135m")


@pytest.fixture
def tiny_model(tokenizer):
    from groupwise.runtime.loading import tiny_random_model

    model, _ = tiny_random_model(seed=0, tokenizer=tokenizer)
    return model
