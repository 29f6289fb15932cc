"""The scripted email agent: its demonstrations are what the rollout records for a perfect policy, graded
correct, and every tool call it writes is a sentence of the server's tool-call grammar."""

from __future__ import annotations

import json

import pytest

from groupwise.envs.email_search import rollout, scenarios
from groupwise.envs.email_search.scripted import demonstration, demonstrations


@pytest.fixture(scope="module")
def train_scenarios():
    return scenarios(0)[0]


def test_every_training_question_gets_a_correct_demonstration(train_scenarios):
    demos = demonstrations(train_scenarios)
    assert len(demos) == len(train_scenarios) == 192
    for s, d in zip(train_scenarios, demos):
        assert d.metrics["correct"] == 1.0 and d.metrics["read_source"] == 1.0 and d.metrics["found_source"] == 1.0
        # correct, cited, 3 of 4 turns: 1 + 0.1 + 0.1 * (1 - 3/4)
        assert d.reward == pytest.approx(1.125)
        calls = [m["tool_calls"][0]["function"] for m in d.messages_and_choices if m.get("tool_calls")]
        assert [c["name"] for c in calls] == ["search_emails", "read_email", "return_final_answer"]
        assert json.loads(calls[2]["arguments"]) == {"answer": s.answer, "sources": [s.source_id]}
        # the search keywords are words of the question (what a model can learn to pick)
        assert all(k.lower() in s.question.lower() for k in json.loads(calls[0]["arguments"])["keywords"])
        # the answer is in the email the agent read (it can learn to copy it)
        assert s.answer in d.messages_and_choices[5]["content"]


async def test_demonstration_is_what_the_rollout_records(scripted, train_scenarios):
    s = train_scenarios[0]
    demo = demonstration(s)
    replies = [{"tool_calls": [(m["tool_calls"][0]["function"]["name"],
                                json.loads(m["tool_calls"][0]["function"]["arguments"]))]}
               for m in demo.messages_and_choices if m.get("tool_calls")]
    traj = await rollout(scripted(replies), s)
    strip = lambda ms: [{k: v for k, v in m.items() if k not in ("tool_call_id", "tool_calls")} |  # noqa: E731
                        ({"calls": [(c["function"]["name"], json.loads(c["function"]["arguments"]))
                                    for c in m["tool_calls"]]} if m.get("tool_calls") else {}) for m in ms]
    assert strip(traj.messages()) == strip(demo.messages())
    assert traj.tools == demo.tools and traj.reward == demo.reward
    assert {k: traj.metrics[k] for k in demo.metrics} == demo.metrics


def test_demonstrated_calls_are_sentences_of_the_tool_call_grammar(train_scenarios):
    """A demonstration the constrained server could never produce would teach the policy nothing usable."""
    from groupwise.inference.constrained import constraint_for
    from groupwise.runtime.loading import load_tokenizer
    from groupwise.training.sft import rendered_turn_ids

    tokenizer = load_tokenizer("smollm2-135m")
    demo = demonstration(train_scenarios[3])
    messages = demo.messages()
    grammar = constraint_for(tokenizer, tools=demo.tools, tool_choice="required")
    turns = [k for k, m in enumerate(messages) if m["role"] == "assistant"]
    assert len(turns) == 3
    for k in turns:
        ids = rendered_turn_ids(messages, k, tokenizer, tools=demo.tools)
        matcher = grammar.new_matcher()
        *call, end = ids
        assert end == tokenizer.eos_token_id  # the turn ends with <|im_end|>, which the grammar then admits
        assert matcher.consume_tokens(call), tokenizer.decode(call)
        assert matcher.is_accepting(), tokenizer.decode(call)


async def test_text_mode_demonstration_is_what_the_text_rollout_records(scripted):
    s = scenarios(0, tool_mode="text")[0][5]
    demo = demonstration(s)
    replies = [m["content"] for m in demo.messages_and_choices if m["role"] == "assistant"]
    assert all(r.startswith("<tool_call>{") and r.endswith("}</tool_call>") for r in replies)
    traj = await rollout(scripted(replies), s)
    assert traj.messages() == demo.messages() and traj.tools is None
    assert traj.metrics["correct"] == 1.0 and traj.reward == demo.reward


def test_the_grammar_reads_tokens_as_bytes_whatever_decoder_transformers_gave(train_scenarios):
    """transformers 5.17 converts SmolLM2's GGUF with a SentencePiece decoder chain; llguidance then read "Ċ"
    as two bytes, every newline of a tool call broke the grammar, and every email episode was all tool errors."""
    import copy

    from tokenizers import decoders

    from groupwise.inference.constrained import constraint_for
    from groupwise.runtime.loading import byte_level_decoder, load_tokenizer
    from groupwise.training.sft import rendered_turn_ids

    tokenizer = load_tokenizer("smollm2-135m")
    assert isinstance(tokenizer.backend_tokenizer.decoder, decoders.ByteLevel)
    as_517 = copy.deepcopy(tokenizer)
    as_517.backend_tokenizer.decoder = decoders.Sequence(
        [decoders.ByteFallback(), decoders.Fuse(), decoders.Replace("▁", " "), decoders.ByteLevel()])
    demo = demonstration(train_scenarios[3])
    messages = demo.messages()
    *call, _ = rendered_turn_ids(messages, 2, tokenizer, tools=demo.tools)
    assert "\n" in tokenizer.decode(call)

    def accepts(tok):
        matcher = constraint_for(tok, tools=demo.tools, tool_choice="required").new_matcher()
        return matcher.consume_tokens(call) and matcher.is_accepting()

    assert not accepts(as_517)  # the failure this guards against
    assert accepts(byte_level_decoder(copy.deepcopy(as_517)))
