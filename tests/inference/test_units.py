"""Tool-call parsing and rendering, loading errors, tiny model determinism."""

from __future__ import annotations

import json

import pytest

from groupwise.errors import ModelNotFoundError
from groupwise.chat.tool_calls import parse_tool_calls, prepare_messages, template_supports_tools
from groupwise.runtime.loading import load_base_model, tiny_random_model


def test_parse_hermes_tool_calls():
    text = 'Let me check.\n<tool_call>\n{"name": "f", "arguments": {"x": 1}}\n</tool_call>\n<tool_call>{"name": "g", "arguments": "{\\"y\\": 2}"}</tool_call>'
    content, calls = parse_tool_calls(text)
    assert content == "Let me check."
    assert [c["function"]["name"] for c in calls] == ["f", "g"]
    assert [json.loads(c["function"]["arguments"]) for c in calls] == [{"x": 1}, {"y": 2}]
    assert all(c["type"] == "function" and c["id"].startswith("call_") for c in calls)


@pytest.mark.parametrize("text", [
    "<tool_call>{not json}</tool_call>",
    '<tool_call>{"arguments": {}}</tool_call>',  # no name
    '<tool_call>["f"]</tool_call>',
    "plain answer",
])
def test_malformed_tool_calls_come_back_as_content(text):
    assert parse_tool_calls(text) == (text, None)


def test_a_tool_call_nested_deeper_than_json_can_decode_comes_back_as_content():
    # json.loads raises RecursionError near 1000 levels: the server would have answered 500
    text = '<tool_call>{"name": "f", "arguments": {"x": ' + "[" * 5000 + "]" * 5000 + "}}</tool_call>"
    assert parse_tool_calls(text) == (text, None)


def test_the_email_env_reads_a_text_tool_call_as_the_server_does():
    # one reader (the chat layer's): the env adds what is wrong for the agent, and its own strictness
    # (keyword arguments: an object) and leniency (a bare JSON object without the tags)
    from groupwise.chat.tool_calls import read_tool_call, tool_call_blocks
    from groupwise.envs.email_search.env import parse_text_tool_calls

    for text in ('<tool_call>{"name": "read_email", "parameters": {"message_id": "m1"}}</tool_call>',
                 '<tool_call>{"name": "read_email", "arguments": "{\\"message_id\\": \\"m1\\"}"}',
                 "<tool_call>{name: read_email}</tool_call>", '<tool_call>{"name": 5}</tool_call>'):
        _, served = parse_tool_calls(text)
        [call] = parse_text_tool_calls(text)
        if served is None:
            assert call.error == read_tool_call(tool_call_blocks(text)[0])[2] + "."
        else:
            assert (call.name, call.arguments, call.error) == (
                served[0]["function"]["name"], json.loads(served[0]["function"]["arguments"]), None)
    [call] = parse_text_tool_calls('<tool_call>{"name": "read_email", "arguments": [1]}</tool_call>')
    assert (call.name, call.arguments, call.error) == ("read_email", None, "arguments must be a JSON object.")


def test_unterminated_tool_call_at_the_end_still_parses():
    content, calls = parse_tool_calls('<tool_call>{"name": "f", "arguments": {}}')
    assert content is None and calls[0]["function"]["name"] == "f"


_TOOL_CALL_TEXTS = [
    '<tool_call>{"name": "f", "arguments": {}}</tool_call>',
    ' before <tool_call>\n {"name": "f", "arguments": {"a": 1}} \n</tool_call> between\n<tool_call>{"name": "g"}\n',
    '<tool_call></tool_call><tool_call>  </tool_call>', "<tool_call>", "<tool_call>\n", "x</tool_call>",
    '<tool_call><tool_call>{"name": "f"}</tool_call>', '\u2003<tool_call>\u2003{"name": "f"}\u2003</tool_call>\u2003',
    '<tool_call>{"name": "f"}</tool_call></tool_call>', '<tool_call>{"name": "f"}\n\n', "no call at all",
]


@pytest.mark.parametrize("text", _TOOL_CALL_TEXTS)
def test_tool_call_blocks_are_read_as_the_regex_read_them(text):
    # the reading the server had, as a regex: the reference the linear scan must agree with
    import re

    block = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.DOTALL)
    from groupwise.chat.tool_calls import tool_call_blocks

    assert tool_call_blocks(text) == [m.group(1) for m in block.finditer(text)]
    content, calls = parse_tool_calls(text)
    if calls:
        assert content == (block.sub("", text).strip() or None)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("fill", [" ", "\n", "a"])
def test_a_long_reply_with_an_open_tool_call_is_read_in_one_pass(fill):
    # The regex backtracked over every pair of positions: "<tool_call>x" + 8,000 spaces + "x" took 0.85 s,
    # 40,000 took 17 s, all of it holding the GIL (the server's event loop and its engine stood still).
    # A grammar forces such a reply cheaply (guided_choice with tools: 40,000 spaces are ~500 tokens),
    # and a small model that degenerates into whitespace writes one. 1,000,000 characters took hours.
    from groupwise.chat.tool_calls import tool_call_blocks

    text = "<tool_call>x" + fill * 1_000_000 + "x"
    assert tool_call_blocks(text) == [text.removeprefix("<tool_call>").strip()]
    assert parse_tool_calls(text) == (text, None)
    assert parse_tool_calls(text + "</tool_call>") == (text + "</tool_call>", None)


@pytest.mark.parametrize("text", [
    '{"a": [1, {"b": "[[["}], "c": "\\\\"}', '[[["\\"]]]"]]]', '{"k": "}}}\\\\\\""}', "[1, [2, [3]]]", "{}",
    '"just a string with ] and {"', '[["a\\\\\\\\", "b"], {"c": ["d\\"e"]}]', "\\ [ \\\"[\" [",
])
def test_json_depth_counts_brackets_outside_strings(text):
    # the regex reading it replaces: strings removed, then brackets counted (texts whose strings all close)
    import re

    from groupwise.chat.tool_calls import json_depth

    depth = deepest = 0
    for bracket in re.findall(r"[\[\]{}]", re.sub(r'"(?:[^"\\]|\\.)*"', "", text, flags=re.DOTALL)):
        depth = depth + 1 if bracket in "[{" else max(0, depth - 1)
        deepest = max(deepest, depth)
    assert json_depth(text) == deepest
    assert json_depth('[["a') == 2 and json_depth('["[[[') == 1  # an unclosed string runs to the end


@pytest.mark.timeout(120)
@pytest.mark.parametrize("tail", ['\\"', '"\\'])
def test_tool_call_arguments_of_many_escaped_quotes_are_read_in_one_pass(tail):
    # An unclosed string of escaped quotes made the string regex start again at every quote: 40,000
    # characters took 7 s of the GIL (the server reads every reply's tool calls). 1,000,000 took hours.
    from groupwise.chat.tool_calls import json_depth

    text = '{"name": "f", "arguments": "' + tail * 500_000
    assert json_depth(text) == 1
    assert parse_tool_calls(f"<tool_call>{text}</tool_call>") == (f"<tool_call>{text}</tool_call>", None)


def test_tools_rendered_into_system_prompt_without_template_support(tiny):
    tok = tiny[1]
    assert not template_supports_tools(tok)  # SmolLM2's template has no tools
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    msgs = [{"role": "user", "content": "q"},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "42"}]
    out, template_tools = prepare_messages(msgs, tools, tok)
    assert template_tools is None
    assert out[0]["role"] == "system" and "<tools>" in out[0]["content"] and '"name": "f"' in out[0]["content"]
    assert out[2]["content"] == '<tool_call>\n{"name": "f", "arguments": {"a": 1}}\n</tool_call>'
    assert out[3]["content"] == "<tool_response>\n42\n</tool_response>"
    text = tok.apply_chat_template(out, tokenize=False, add_generation_prompt=True)
    assert text.endswith("<|im_start|>assistant\n")


def test_missing_model_names_every_place_tried(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # fail fast instead of retrying the hub
    with pytest.raises(ModelNotFoundError) as info:
        load_base_model(str(tmp_path / "no-such-model"))
    message = str(info.value)
    assert "smollm2-135m" in message and "does not exist" in message and "from_pretrained" in message


def test_tiny_random_model_is_deterministic(tiny):
    a, tok = tiny_random_model(seed=3, tokenizer=tiny[1])
    b, _ = tiny_random_model(seed=3, tokenizer=tiny[1])
    c, _ = tiny_random_model(seed=4, tokenizer=tiny[1])
    wa, wb, wc = (m.model.embed_tokens.weight for m in (a, b, c))
    assert (wa == wb).all() and not (wa == wc).all()
    assert a.config.vocab_size == len(tok) == 49152


def test_serve_off_loopback_requires_api_key(tmp_path):
    from groupwise.errors import ConfigError
    from groupwise.jobs.serve import ServeJob

    with pytest.raises(ConfigError) as info:  # refused when the job is built, before any model is loaded
        ServeJob(model="smollm2-135m", host="0.0.0.0", adapter=[str(tmp_path)])
    assert "--api-key" in str(info.value) and "adapter_config.json" in str(info.value)
    assert len(info.value.problems) == 2


def test_registry_drops_a_busy_step_later(tiny, adapter_dirs):
    from groupwise.inference.engine import Engine, GenerationRequest
    from groupwise.inference.registry import ModelRegistry

    model, tok = tiny_random_model(seed=0, tokenizer=tiny[1])
    engine = Engine(model, tok, max_batch_size=2)
    try:
        registry = ModelRegistry(engine)
        registry.add_step("agent", 1, adapter_dirs[1])
        with engine.paused():  # a request for step 1 is queued while the step is dropped
            future = engine.submit(GenerationRequest([1, 2, 3], max_new_tokens=2, adapter="agent@1"))
            registry.remove_step("agent", 1)
            assert registry.steps("agent") == [0] and engine.adapters() == ["agent@1"]
        assert future.result(timeout=60).adapter == "agent@1"  # served by its own adapter
        registry.add_step("agent", 2, adapter_dirs[2])  # the next call frees the old adapter
        assert engine.adapters() == ["agent@2"]
        with pytest.raises(ModelNotFoundError, match=r"served steps: \[0, 2\]"):
            registry.resolve("agent@1")
    finally:
        engine.close()


def test_registry_serves_a_model_name_with_a_dot(tiny, adapter_dirs):
    # peft refuses '.' in adapter names; a run called e.g. "agent-lr0.0001" must still serve its steps,
    # and the engine names the adapter as the user does (peft sees only the slot holding it).
    from groupwise.inference.engine import Engine, EngineError, GenerationRequest
    from groupwise.inference.registry import ModelRegistry

    model, tok = tiny_random_model(seed=0, tokenizer=tiny[1])
    engine = Engine(model, tok, max_batch_size=2)
    try:
        registry = ModelRegistry(engine)
        assert registry.add_step("agent-lr0.0001", 1, adapter_dirs[1]) == "agent-lr0.0001@1"
        assert engine.adapters() == ["agent-lr0.0001@1"]
        result = engine.submit(GenerationRequest([1, 2, 3], max_new_tokens=2, adapter="agent-lr0.0001@1"))
        assert result.result(timeout=60).adapter == "agent-lr0.0001@1"
        with pytest.raises(EngineError, match=r"adapter 'agent-lr0.0001@2' is not loaded; loaded: \['agent-lr0.0001@1'\]"):
            engine.submit(GenerationRequest([1, 2, 3], adapter="agent-lr0.0001@2"))
    finally:
        engine.close()
