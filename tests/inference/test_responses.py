"""Response bodies built in parts (responses.py): the JSON a dump of the whole response gives."""

from __future__ import annotations

import json

import pytest

from groupwise.errors import NonFiniteError
from groupwise.inference.engine import Completion, GenerationResult
from groupwise.inference.responses import TokenTexts, chat_response, token_entries


def _ids(tok) -> list[int]:
    """Sampled ids a tokenizer makes awkward: byte tokens of one UTF-8 character split across ids,
    a special token, a space-led word, a quote and a backslash (escaped in JSON), repeats."""
    ids = tok.encode('é 中 "q" \\ done', add_special_tokens=False)
    return [*ids, tok.eos_token_id, ids[0], *tok.encode(" hello", add_special_tokens=False), ids[0]]


def _expected(tok, ids, logprobs, as_ids: bool) -> list[dict]:
    texts = [tok.decode([i]) for i in ids]
    return [{"token": f"token_id:{i}" if as_ids else t, "logprob": lp, "bytes": list(t.encode()), "top_logprobs": []}
            for i, t, lp in zip(ids, texts, logprobs)]


@pytest.mark.parametrize("as_ids", [True, False])
def test_chat_body_is_the_dump_of_the_whole_response(tiny, as_ids):
    _, tok = tiny
    ids = _ids(tok)
    logprobs = [-0.1 * k - 1e-17 for k in range(len(ids))]
    texts = TokenTexts(tok)
    result = GenerationResult([Completion(0, ids, logprobs, [], tok.decode(ids), "length", [2], ["a@3"] * len(ids)),
                               Completion(1, ids[:3], logprobs[:3], [], tok.decode(ids[:3]), "stop")], 7, None)
    header = {"id": "chatcmpl-1", "created": 5, "model": "a@3", "system_fingerprint": "a@3"}
    for _ in range(2):  # the cache empty, then full
        body = json.loads(chat_response(texts, result, header, False, as_ids))
        assert body == {**header, "object": "chat.completion", "usage": {"prompt_tokens": 7, "completion_tokens": len(ids) + 3,
                                                                          "total_tokens": len(ids) + 10},
                        "choices": [
                            {"index": 0, "message": {"role": "assistant", "content": tok.decode(ids)},
                             "finish_reason": "length", "token_ids": ids, "forced_token_indices": [2],
                             "policy_versions": [3] * len(ids), "logprobs": {"content": _expected(tok, ids, logprobs, as_ids)}},
                            {"index": 1, "message": {"role": "assistant", "content": tok.decode(ids[:3])},
                             "finish_reason": "stop", "token_ids": ids[:3], "forced_token_indices": [],
                             "logprobs": {"content": _expected(tok, ids[:3], logprobs[:3], as_ids)}}]}
        # every float comes back bit for bit
        assert [e["logprob"] for e in body["choices"][0]["logprobs"]["content"]] == logprobs
        # the other naming from the same cache
        other = json.loads(chat_response(texts, result, header, False, not as_ids))["choices"][0]["logprobs"]["content"]
        assert other == _expected(tok, ids, logprobs, not as_ids)


def test_chat_body_with_alternatives_and_a_non_finite_logprob(tiny):
    _, tok = tiny
    ids = _ids(tok)[:4]
    texts = TokenTexts(tok)
    tops = [[(i, -0.5), (ids[0], -2.0)] for i in ids]
    result = GenerationResult([Completion(0, ids, [-0.5] * 4, tops, tok.decode(ids), "length")], 3, None)
    entries = json.loads(chat_response(texts, result, {}, False, True))["choices"][0]["logprobs"]["content"]
    assert [[t["token"] for t in e["top_logprobs"]] for e in entries] == [[f"token_id:{i}", f"token_id:{ids[0]}"] for i in ids]
    assert [e["bytes"] for e in entries] == [list(tok.decode([i]).encode()) for i in ids]
    bad = GenerationResult([Completion(0, ids, [-0.5, float("-inf"), -0.5, -0.5], [], "", "length")], 3, None)
    with pytest.raises(NonFiniteError, match="logprob -inf for sampled token"):
        chat_response(texts, bad, {}, False, True)


@pytest.mark.parametrize("as_ids", [True, False])
def test_alternatives_built_in_parts_are_the_dump_of_their_entries(tiny, as_ids):
    """Alternatives are joined from each id's cached JSON (a 20-alternative answer was a million dicts
    dumped at once); the text is what dumping `token_entries`' dicts gives, floats bit for bit, and an
    alternative whose logprob JSON cannot carry fails the response as the dump did."""
    _, tok = tiny
    ids = _ids(tok)
    logprobs = [-0.1 * k - 1e-17 for k in range(len(ids))]
    tops = [[(i, lp), (ids[k - 1], -1 / 3 - k), (tok.eos_token_id, -30.000000000000004)]
            for k, (i, lp) in enumerate(zip(ids, logprobs))]
    texts = TokenTexts(tok)
    result = GenerationResult([Completion(0, ids, logprobs, tops, tok.decode(ids), "length")], 3, None)
    for _ in range(2):  # the cache empty, then full
        body = chat_response(texts, result, {}, False, as_ids).decode()
        expected = json.dumps(token_entries(TokenTexts(tok), ids, logprobs, tops, as_ids), ensure_ascii=False,
                              separators=(",", ":"))
        assert '"logprobs":{"content":' + expected + "}}" in body
    tops[2][1] = (ids[0], float("nan"))
    with pytest.raises(NonFiniteError, match=f"logprob nan for alternative token {ids[0]}"):
        chat_response(texts, result, {}, False, as_ids)


def test_compact_body_carries_the_same_logprobs_as_one_list(tiny):
    """A groupwise client's request without logprobs (compact): ``logprobs`` null, the sampled tokens'
    logprobs bit for bit in ``token_logprobs`` and their texts in ``token_texts``; a choice with alternatives keeps its entries (they were asked
    for), and a non-finite logprob fails as in the full body."""
    _, tok = tiny
    ids = _ids(tok)
    logprobs = [-0.1 * k - 1e-17 for k in range(len(ids))]
    texts = TokenTexts(tok)
    result = GenerationResult([Completion(0, ids, logprobs, [], tok.decode(ids), "length", [1])], 7, None)
    full = json.loads(chat_response(texts, result, {}, False, True))["choices"][0]
    compact = json.loads(chat_response(texts, result, {}, False, True, compact=True))["choices"][0]
    assert compact.pop("logprobs") is None and compact.pop("token_logprobs") == logprobs
    assert compact.pop("token_texts") == [tok.decode([i]) for i in ids]
    assert [e["logprob"] for e in full.pop("logprobs")["content"]] == logprobs
    assert compact == full  # token ids, forced indices, message: the same
    tops = GenerationResult([Completion(0, ids[:2], logprobs[:2], [[(ids[0], -0.5)]] * 2, "", "length")], 3, None)
    kept = json.loads(chat_response(texts, tops, {}, False, True, compact=True))["choices"][0]
    assert "token_logprobs" not in kept and [e["logprob"] for e in kept["logprobs"]["content"]] == logprobs[:2]
    bad = GenerationResult([Completion(0, ids[:2], [-0.5, float("nan")], [], "", "length")], 3, None)
    with pytest.raises(NonFiniteError, match="logprob nan for sampled token"):
        chat_response(texts, bad, {}, False, True, compact=True)
