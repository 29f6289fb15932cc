"""Fixtures of the integration tests (LangGraph, MCP): a tiny random Llama with SmolLM2's tokenizer,
saved as a folder that LocalBackend loads as it would a Hugging Face id."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    from groupwise.loading import load_tokenizer, tiny_random_model

    path = tmp_path_factory.mktemp("tiny-llama")
    model, tokenizer = tiny_random_model(seed=0, tokenizer=load_tokenizer("smollm2-135m"))
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)
