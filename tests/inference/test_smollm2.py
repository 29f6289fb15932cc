"""SmolLM2-135M (the real packaged model): json_schema output validates; a chat answer is text."""

from __future__ import annotations

import json

import jsonschema
import pytest

pytestmark = pytest.mark.slow

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 30},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "likes_cats": {"type": "boolean"},
    },
    "required": ["name", "age", "likes_cats"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def smol_client():
    from groupwise.inference.client import in_process_client
    from groupwise.inference.engine import Engine
    from groupwise.inference.registry import ModelRegistry
    from groupwise.inference.server import create_app
    from groupwise.runtime.loading import load_base_model

    model, tok = load_base_model("smollm2-135m", device="cpu")
    engine = Engine(model, tok, max_batch_size=8)
    app = create_app(ModelRegistry(engine, base_name="smollm2-135m"))
    yield in_process_client(app)
    engine.close()


async def test_json_schema_answer_validates(smol_client):
    r = await smol_client.chat.completions.create(
        model="smollm2-135m",
        messages=[{"role": "user", "content": "Describe a person called Ann, 31, who likes cats, as JSON."}],
        response_format={"type": "json_schema", "json_schema": {"name": "person", "schema": SCHEMA}},
        max_tokens=80, seed=0,
    )
    answer = json.loads(r.choices[0].message.content)
    jsonschema.validate(answer, SCHEMA)
    assert r.choices[0].finish_reason == "stop"


async def test_json_object_and_plain_chat(smol_client):
    r = await smol_client.chat.completions.create(
        model="smollm2-135m", messages=[{"role": "user", "content": "Give me a JSON object with a key 'a'."}],
        response_format={"type": "json_object"}, max_tokens=60, seed=0)
    assert isinstance(json.loads(r.choices[0].message.content), dict)
    chat = await smol_client.chat.completions.create(
        model="smollm2-135m", messages=[{"role": "user", "content": "What is the capital of France?"}],
        max_tokens=20, temperature=0)
    assert "Paris" in chat.choices[0].message.content
