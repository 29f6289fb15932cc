"""RULER against a real OpenAI-compatible HTTP server (the scripted judge of conftest.py)."""

from __future__ import annotations

import json

import pytest
from judge_helpers import Reply, answer, honest, quality_of, shown_trajectories

import groupwise as gw
from groupwise.judge import judge_stats, ruler, ruler_score_group

TOOLS = [{"type": "function", "function": {"name": "search", "parameters": {"type": "object", "properties": {}}}}]


def make_group(qualities, *, prefix_marker="SHARED-TASK-7f3a", **group_kwargs) -> gw.TrajectoryGroup:
    trajs = []
    for i, q in enumerate(qualities):
        trajs.append(
            gw.Trajectory(
                messages_and_choices=[
                    {"role": "system", "content": "You are an agent that answers questions."},
                    {"role": "user", "content": f"Question {prefix_marker}: what is 6 x 7?"},
                    {"role": "assistant", "content": f"attempt {i}: my answer, quality={q}"},
                ],
                tools=TOOLS,
                reward=float(i),
                metadata={"attempt": i},
                metrics={"turns": 1},
                initial_policy_version=3,
                final_policy_version=4,
            )
        )
    return gw.TrajectoryGroup(trajs, **group_kwargs)


def opts(server, **kw):
    return {"base_url": server.url, "api_key": "test", "backoff_s": 0.0, **kw}


async def test_one_request_prefix_once_shuffled_and_mapped_by_id(judge_server):
    qualities = [0.1, 0.9, 0.4, 0.7, 0.25]
    judged = await ruler_score_group(make_group(qualities), "scripted", **opts(judge_server))
    assert len(judge_server.requests) == 1
    req = judge_server.requests[0]
    user = req["messages"][1]["content"]
    assert user.count("SHARED-TASK-7f3a") == 1  # the common prefix is sent once, not 5 times
    assert user.count('"name": "search"') == 1  # tools once
    shown = [quality_of(b) for _, b in shown_trajectories(req)]
    assert shown != qualities and sorted(shown) == sorted(qualities)  # shown shuffled
    # The scripted judge answers in reverse id order; mapping by id still gives each its own quality.
    assert judged.rewards() == qualities
    assert req["response_format"]["type"] == "json_schema"
    schema = req["response_format"]["json_schema"]["schema"]
    assert schema["properties"]["scores"]["minItems"] == 5
    assert schema["properties"]["scores"]["items"]["properties"]["trajectory_id"]["enum"] == ["1", "2", "3", "4", "5"]


async def test_system_prompt_byte_identical_across_groups(judge_server):
    await ruler_score_group(make_group([0.2, 0.8]), "scripted", **opts(judge_server))
    await ruler_score_group(make_group([0.5, 0.6, 0.3], prefix_marker="OTHER"), "scripted", **opts(judge_server, seed=9))
    a, b = (r["messages"][0] for r in judge_server.requests)
    assert a == b and a["role"] == "system" and "Grading standards" in a["content"]


async def test_group_fields_survive(judge_server):
    exc = gw.PydanticException(type="ValueError", message="rollout 6 failed", traceback="tb")
    group = make_group([0.3, 0.6], metadata={"scenario": "s1"}, metrics={"gather/seconds": 2.5}, exceptions=[exc], logs=["g"])
    judged = await ruler_score_group(group, "scripted", **opts(judge_server))
    assert judged.metadata == {"scenario": "s1"}
    assert judged.metrics["gather/seconds"] == 2.5
    assert judged.exceptions == [exc] and judged.logs == ["g"]
    for i, t in enumerate(judged.trajectories):
        assert t.metrics["independent_reward"] == float(i)  # the old reward
        assert t.metrics["ruler_score"] == t.reward == [0.3, 0.6][i]
        assert t.metrics["turns"] == 1 and t.metadata == {"attempt": i}
        assert (t.initial_policy_version, t.final_policy_version) == (3, 4)
        assert t.logs[-1].startswith("RULER explanation: ") and "looks like" in t.logs[-1]
    assert group.trajectories[0].reward == 0.0  # the input group is not modified


def bad_count(req):
    ids = shown_trajectories(req)
    return Reply(answer([(t, 0.5) for t, _ in ids[:-1]]))


def out_of_range(req):
    return Reply(answer([(t, 1.5) for t, _ in shown_trajectories(req)]))


BAD_REPLIES = {
    "wrong_count": bad_count,
    "bad_json": Reply('{"scores": [oops'),
    "out_of_range": out_of_range,
    "timeout": Reply(answer([("1", 0.5), ("2", 0.5)]), delay=1.0),  # timeout=0.3 below
    "http_500": Reply(status=500),
}


@pytest.mark.parametrize("kind", sorted(BAD_REPLIES))
async def test_bad_answer_retried_then_succeeds(judge_server, kind):
    judge_server.script.append(BAD_REPLIES[kind])
    judged = await ruler_score_group(make_group([0.2, 0.8]), "scripted", **opts(judge_server, timeout=0.3))
    assert judged.rewards() == [0.2, 0.8]
    assert len(judge_server.requests) == 2
    assert judged.metrics["judge/retries"] == 1


@pytest.mark.parametrize("kind", sorted(BAD_REPLIES))
async def test_bad_answer_exhausts_retries_raises_or_drops(judge_server, kind):
    judge_server.default = lambda req: BAD_REPLIES[kind] if isinstance(BAD_REPLIES[kind], Reply) else BAD_REPLIES[kind](req)
    o = opts(judge_server, timeout_s=0.3, retries=1)
    with pytest.raises(gw.JudgeError) as err:
        await ruler_score_group(make_group([0.2, 0.8]), "scripted", **o)
    assert len(judge_server.requests) == 2  # 1 try + 1 retry
    assert "after 2 attempts" in str(err.value)
    if kind == "bad_json":
        assert err.value.raw == '{"scores": [oops'
    before = judge_stats.dropped_groups
    assert await ruler_score_group(make_group([0.2, 0.8]), "scripted", swallow_exceptions=True, **o) is None
    assert judge_stats.dropped_groups == before + 1


async def test_client_error_is_not_retried(judge_server):
    judge_server.default = lambda req: Reply(status=401)
    with pytest.raises(gw.JudgeError, match="HTTP 401"):
        await ruler_score_group(make_group([0.2, 0.8]), "scripted", **opts(judge_server))
    assert len(judge_server.requests) == 1


async def test_repair_request_without_json_schema(judge_server):
    judge_server.script.append(Reply("Sure! Here are the scores: trajectory 1 is bad."))
    judged = await ruler_score_group(make_group([0.2, 0.8]), "scripted", **opts(judge_server, response_format="none"))
    assert judged.rewards() == [0.2, 0.8]
    assert "response_format" not in judge_server.requests[0]
    repair = judge_server.requests[1]["messages"]
    assert [m["role"] for m in repair] == ["system", "user", "assistant", "user"]
    assert "could not be used" in repair[3]["content"]
    assert judged.metrics["judge/retries"] == 0 and judged.metrics["judge/requests"] == 2


async def test_cache_hit_sends_no_request(judge_server, tmp_path):
    o = opts(judge_server, cache=str(tmp_path / "cache"))
    first = await ruler_score_group(make_group([0.2, 0.8]), "scripted", **o)
    second = await ruler_score_group(make_group([0.2, 0.8]), "scripted", **o)
    assert len(judge_server.requests) == 1
    assert second.rewards() == first.rewards() == [0.2, 0.8]
    assert second.metrics["judge/cache_hits"] == 1 and second.metrics["judge/requests"] == 0
    await ruler_score_group(make_group([0.2, 0.8]), "scripted", **o, seed=1)  # other order: other key
    assert len(judge_server.requests) == 2


async def test_cache_takes_any_trajectory_text_and_misses_on_foreign_entries(judge_server, tmp_path):
    # A lone surrogate in a trajectory (storable since the store writes its escape) failed the SDK's
    # strict UTF-8 encoding of the request body, and with a cache the key's encoding first: the judge
    # crashed on the group with a UnicodeEncodeError. The judge is shown U+FFFD in its place.
    group = make_group([0.2, 0.8], prefix_marker="lone \ud800 surrogate")
    uncached = await ruler_score_group(group, "scripted", **opts(judge_server))
    assert "lone \ufffd surrogate" in judge_server.requests[0]["messages"][1]["content"]
    o = opts(judge_server, cache=str(tmp_path / "cache"))
    first = await ruler_score_group(group, "scripted", **o)
    second = await ruler_score_group(group, "scripted", **o)
    assert uncached.rewards() == first.rewards() == second.rewards() == [0.2, 0.8]
    assert len(judge_server.requests) == 2
    # An entry that is JSON but not an answer (another tool's file, an edit) was read as one:
    # AttributeError ('list' object has no attribute 'get'). It is a miss, and the fresh answer replaces it.
    for entry in ("[1]", '{"content": 5}', '"text"', "[" * 50_000):
        for f in (tmp_path / "cache").glob("*/*.json"):
            f.write_text(entry)
        again = await ruler_score_group(group, "scripted", **o)
        assert again.rewards() == [0.2, 0.8]
    assert len(judge_server.requests) == 6


async def test_cost_accounted_for_openai_provider(judge_server, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    monkeypatch.setenv("OPENAI_BASE_URL", judge_server.url)
    judged = await ruler_score_group(make_group([0.2, 0.8]), "openai/gpt-4o-mini", backoff_s=0.0)
    req = judge_server.requests[0]
    assert req["model"] == "gpt-4o-mini"
    # scripted usage: 1000 prompt + 200 completion tokens; gpt-4o-mini: $0.15 / $0.60 per M tokens
    # cost = (1000 * 0.15 + 200 * 0.60) / 1e6 = (150 + 120) / 1e6 = 0.00027
    assert judged.metrics["judge/prompt_tokens"] == 1000
    assert judged.metrics["judge/completion_tokens"] == 200
    assert judged.metrics["judge/cost_usd"] == pytest.approx(0.00027)
    # a retry's tokens are paid too: 2 requests -> twice the cost; user prices override the table
    judge_server.script.append(Reply("not json"))
    judged = await ruler_score_group(make_group([0.2, 0.8]), "openai/gpt-4o-mini", backoff_s=0.0, prices={"gpt-4o-mini": (1.0, 2.0)})
    # (2000 * 1.0 + 400 * 2.0) / 1e6 = 0.0028
    assert judged.metrics["judge/cost_usd"] == pytest.approx(0.0028)


@pytest.mark.parametrize("model,var", [("openai/o4-mini", "OPENAI_API_KEY"), ("openrouter/qwen/qwen3-32b", "OPENROUTER_API_KEY")])
async def test_missing_key_names_the_variable_or_is_swallowed_and_counted(monkeypatch, model, var):
    monkeypatch.delenv(var, raising=False)
    with pytest.raises(gw.JudgeError, match=var):
        await ruler_score_group(make_group([0.2, 0.8]), model)
    from groupwise.judge import judge_stats

    before = judge_stats.dropped_groups
    assert await ruler_score_group(make_group([0.2, 0.8]), model, swallow_exceptions=True) is None  # as ART
    assert judge_stats.dropped_groups == before + 1 and var in judge_stats.last_errors[-1]


async def test_passes_average_rotations_and_cancel_position_bias(judge_server):
    # A position-biased judge: +0.3 to whatever it is shown first (id "1"), clipped to 1.
    def biased(req):
        return Reply(answer([(t, min(1.0, quality_of(b) + (0.3 if t == "1" else 0.0))) for t, b in shown_trajectories(req)]))

    judge_server.default = biased
    qualities = [0.1, 0.3, 0.5, 0.6]
    judged = await ruler_score_group(make_group(qualities), "scripted", **opts(judge_server, passes=4))
    assert len(judge_server.requests) == 4
    firsts = [quality_of(shown_trajectories(r)[0][1]) for r in judge_server.requests]
    assert sorted(firsts) == sorted(qualities)  # 4 rotations: each trajectory shown first exactly once
    # each is boosted in exactly 1 of 4 passes: quality + 0.3 / 4 = quality + 0.075
    assert judged.rewards() == pytest.approx([0.175, 0.375, 0.575, 0.675])
    assert judged.metrics["judge/passes"] == 4
    assert -1.0 <= judged.metrics["judge/pass_spearman"] < 1.0  # the bias changed the ranking in some pass
    judge_server.default = honest
    judged = await ruler_score_group(make_group(qualities), "scripted", **opts(judge_server, passes=3))
    assert judged.metrics["judge/pass_spearman"] == pytest.approx(1.0)


async def test_large_group_is_chunked_and_reconciled_on_anchors(judge_server):
    # A purely relative judge: it stretches what it is shown to [0, 1] (min-max of the chunk).
    def relative(req):
        shown = [(t, quality_of(b)) for t, b in shown_trajectories(req)]
        lo, hi = min(q for _, q in shown), max(q for _, q in shown)
        return Reply(answer([(t, (q - lo) / (hi - lo)) for t, q in shown]))

    judge_server.default = relative
    qualities = [0.05, 0.12, 0.2, 0.33, 0.4, 0.47, 0.58, 0.66, 0.8, 0.91]
    judged = await ruler_score_group(make_group(qualities), "scripted", **opts(judge_server, max_group_size=4, anchors=2))
    # first chunk 4; the other 6 in chunks of 4 - 2 anchors = 2 -> 3 more requests
    assert len(judge_server.requests) == 4 and judged.metrics["judge/chunks"] == 4
    first = [quality_of(b) for _, b in shown_trajectories(judge_server.requests[0])]
    lo, hi = min(first), max(first)
    # Every chunk's scores are linear in quality, so the anchor fit is exact: each trajectory ends on
    # the first chunk's scale, (q - lo) / (hi - lo), clipped to [0, 1].
    expected = [min(1.0, max(0.0, (q - lo) / (hi - lo))) for q in qualities]
    assert judged.rewards() == pytest.approx(expected)
    assert judged.metrics["judge/anchor_mae"] == pytest.approx(0.0, abs=1e-9)
    for r in judge_server.requests[1:]:
        assert len(shown_trajectories(r)) == 4


async def test_identical_trajectories_shown_once(judge_server):
    group = make_group([0.3, 0.3, 0.7])
    group.trajectories[1].messages_and_choices = group.trajectories[0].messages_and_choices
    judged = await ruler_score_group(group, "scripted", **opts(judge_server))
    assert len(shown_trajectories(judge_server.requests[0])) == 2
    assert judged.rewards() == [0.3, 0.3, 0.7]


async def test_additional_histories_are_shown(judge_server):
    group = make_group([0.2, 0.8])
    group.trajectories[1].additional_histories = [
        gw.History(messages_and_choices=[{"role": "user", "content": "summarise SUBAGENT-NOTE"}])
    ]
    await ruler_score_group(group, "scripted", **opts(judge_server))
    user = judge_server.requests[0]["messages"][1]["content"]
    assert user.count("SUBAGENT-NOTE") == 1 and "<side_conversation" in user


async def test_ruler_returns_input_order_and_debug_is_readable(judge_server, capsys):
    lists = [make_group([q]).trajectories[0].messages() for q in (0.6, 0.2, 0.9)]
    scores = await ruler(lists, "scripted", debug=True, **opts(judge_server))
    assert [s.index for s in scores] == [0, 1, 2] and [s.score for s in scores] == [0.6, 0.2, 0.9]
    out = capsys.readouterr().out
    assert "RULER scripted: 3 trajectories, 1 request(s)" in out
    assert " *#2   score 0.90  last: attempt 0: my answer, quality=0.9" in out
    assert "why: looks like 0.90" in out


async def test_invalid_options_reported_together():
    with pytest.raises(gw.ConfigError) as err:
        await ruler([[{"role": "user", "content": "x"}]], "scripted", base_url="http://x", passes=0, retries=-1, max_group_size=3, anchors=2)
    assert len(err.value.problems) == 3


def test_import_does_not_load_torch():
    import subprocess
    import sys

    code = "import sys, groupwise.judge, groupwise; groupwise.ruler_score_group; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_messages_rendered_readably_without_json_escaping():
    from groupwise.judge.prompt import _render_message

    assert _render_message({"role": "user", "content": "hi", "name": None}) == "[user] hi"
    call = {"id": "c1", "type": "function", "function": {"name": "search", "arguments": '{"q": "a \\"b\\""}'}}
    assert _render_message({"role": "assistant", "content": None, "tool_calls": [call]}) == '[assistant calls search c1] {"q": "a \\"b\\""}'
    assert _render_message({"role": "tool", "tool_call_id": "c1", "content": '["x"]'}) == '[tool result c1] ["x"]'
    bad_args = {"function": {"name": "f", "arguments": "{not json"}}
    assert _render_message({"role": "assistant", "tool_calls": [bad_args]}) == "[assistant calls f] {not json"


async def test_failing_pass_cancels_the_others_and_raises(judge_server):
    # pass 1 gets a 401 at once; pass 0 is still waiting on a slow answer and is cancelled.
    judge_server.script.extend([Reply(answer([("1", 0.5), ("2", 0.5)]), delay=2.0), Reply(status=401)])
    with pytest.raises(gw.JudgeError, match="HTTP 401"):
        await ruler_score_group(make_group([0.2, 0.8]), "scripted", **opts(judge_server, passes=2))
    assert len(judge_server.requests) == 2


async def test_art_style_extra_litellm_params(judge_server):
    # ART: ruler_score_group(group, judge_model, extra_litellm_params, rubric=...)
    params = {"api_base": judge_server.url, "api_key": "k", "temperature": 0.3, "reasoning_effort": "low"}
    judged = await ruler_score_group(make_group([0.2, 0.8]), "scripted", params, backoff_s=0.0)
    assert judged.rewards() == [0.2, 0.8]
    req = judge_server.requests[0]
    assert req["temperature"] == 0.3 and req["reasoning_effort"] == "low"
    # ART's positions: the rubric is the fourth argument, after extra_litellm_params
    await ruler_score_group(make_group([0.2, 0.8]), "scripted", params, "- Shorter answers score higher.",
                            backoff_s=0.0)
    assert "Shorter answers score higher" in json.dumps(judge_server.requests[-1]["messages"])


async def test_share_continuations_sends_shared_first_turns_once(judge_server):
    group = make_group([0.2, 0.9, 0.5, 0.4])
    for i, t in enumerate(group.trajectories):  # rollouts 0-2 made the same first search; 3 another
        last = t.messages_and_choices.pop()
        query = "OTHER" if i == 3 else "SAME"
        t.messages_and_choices += [
            {"role": "assistant", "content": f"search {query}"},
            {"role": "user", "content": f"search results: {query}-RESULTS"},
            last,
        ]
    judged = await ruler_score_group(group, "scripted", **opts(judge_server, share_continuations=True))
    user = judge_server.requests[0]["messages"][1]["content"]
    assert user.count("SAME-RESULTS") == 1 and user.count("OTHER-RESULTS") == 1
    assert user.count("first 2 message(s) after the context are identical to trajectory") == 2
    assert judged.rewards() == [0.2, 0.9, 0.5, 0.4]
    await ruler_score_group(group, "scripted", **opts(judge_server))  # default: each shown in full
    assert judge_server.requests[1]["messages"][1]["content"].count("SAME-RESULTS") == 3


async def test_chunks_and_passes_together_keep_the_ranking(judge_server):
    def relative(req):
        shown = [(t, quality_of(b)) for t, b in shown_trajectories(req)]
        lo, hi = min(q for _, q in shown), max(q for _, q in shown)
        return Reply(answer([(t, (q - lo) / (hi - lo)) for t, q in shown]))

    judge_server.default = relative
    qualities = [0.05, 0.12, 0.2, 0.33, 0.4, 0.47, 0.58, 0.66, 0.8, 0.91]
    judged = await ruler_score_group(make_group(qualities), "scripted", **opts(judge_server, max_group_size=4, anchors=2, passes=2))
    assert len(judge_server.requests) == 8  # 2 passes x (1 first chunk + 3 anchored chunks)
    r = judged.rewards()
    assert all(0.0 <= x <= 1.0 for x in r)
    assert r == sorted(r)  # each pass maps quality monotonically, so their mean does too
    assert judged.metrics["judge/pass_spearman"] > 0.9


async def test_openai_judge_follows_litellms_base_url_variable(judge_server, monkeypatch):
    """ART's RULER went through LiteLLM, which reads ``OPENAI_API_BASE`` for the openai provider: an ART
    program that points its judge there reaches the same server here. When both are set, ``OPENAI_API_BASE``
    wins, as in LiteLLM (which passes its own base URL to the SDK, so the SDK's ``OPENAI_BASE_URL`` is then
    not read); ``OPENAI_BASE_URL`` alone is read too."""
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    monkeypatch.setenv("OPENAI_API_BASE", judge_server.url)
    judged = await ruler_score_group(make_group([0.2, 0.8]), "openai/o3", backoff_s=0.0)
    assert len(judge_server.requests) == 1 and judge_server.requests[0]["model"] == "o3"
    assert judged.rewards() == [0.2, 0.8]
    monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:9/v1")  # nothing listens there
    await ruler_score_group(make_group([0.2, 0.8]), "openai/o3", backoff_s=0.0)
    assert len(judge_server.requests) == 2
    monkeypatch.setenv("OPENAI_BASE_URL", judge_server.url)
    monkeypatch.delenv("OPENAI_API_BASE")
    await ruler_score_group(make_group([0.2, 0.8]), "openai/o3", backoff_s=0.0)
    assert len(judge_server.requests) == 3


async def test_a_200_trajectory_group_is_judged_whole_in_chunks(judge_server):
    """A very large group: every trajectory is shown (in chunks of at most max_group_size) and scored;
    none is dropped or truncated to fit one prompt."""
    judge_server.default = honest
    qualities = [round(0.005 * i, 3) for i in range(200)]
    judged = await ruler_score_group(make_group(qualities), "scripted", **opts(judge_server))
    shown = [q for r in judge_server.requests for q in shown_trajectories(r)]
    assert all(len(shown_trajectories(r)) <= 12 for r in judge_server.requests)
    blocks = {b for _, b in shown}
    assert all(any(f"attempt {i}: my answer, quality={q}" in b for b in blocks) for i, q in enumerate(qualities))
    assert judged.metrics["judge/chunks"] == 1 + -(-(200 - 12) // (12 - 3)) == len(judge_server.requests)
    # an honest (absolute) judge: the anchor fit is the identity and each trajectory keeps its own score
    assert judged.rewards() == pytest.approx(qualities, abs=1e-9)
