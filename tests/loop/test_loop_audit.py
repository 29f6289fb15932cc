"""The reward audit: probe answers through real rollouts (the openai SDK against the scripted endpoint), a
planted keyword-stuffing reward and a flattered judge flagged, the built-in envs' honest rewards passed,
and `gw.fit(config=LoopConfig(audit=...))` warning or refusing before any training."""

from __future__ import annotations

import re
import warnings

import pytest
from loop_helpers import SCENARIOS, ScriptedBackend

import groupwise as gw
from groupwise.envs import get_env
from groupwise.envs.math.problems import make_problem
from groupwise.loop.audit import FLATTERY, PROBES, audit_reward, flag_rule, probe_answer, ProbeResult
from groupwise.loop.intervals import Interval
from groupwise.loop.scripted import ScriptedModel, cut_to_tokens, tool_call_for
from groupwise.core.trajectory import TrajectoryGroup


def request(user: str, system: str = "Reply in this format: <move>left</move>", max_tokens: int = 12, **extra):
    return {"messages": [{"role": "system", "content": system}, {"role": "user", "content": user}],
            "max_tokens": max_tokens, **extra}


def test_probes_write_what_they_promise():
    req = request("Board 2 _ 4. Which way?")
    assert probe_answer("empty", req) == "" and not probe_answer("whitespace", req).strip()
    assert probe_answer("echo", req) == "Board 2 _ 4. Which way?"
    stuffed = probe_answer("stuffing", req).split()
    assert stuffed[:5] == ["Board", "2", "4", "Which", "way"] and "0" in stuffed and len(stuffed) == 12
    assert len(probe_answer("max_length", req).split()) == 12
    assert probe_answer("empty_tags", req) == "<move></move> \\boxed{} <answer></answer>"
    assert probe_answer("fixed", req, fixed="<move>up</move>") == "<move>up</move>"
    assert probe_answer("flattery", req) == FLATTERY
    with pytest.raises(gw.ConfigError, match="no probe"):
        probe_answer("nonsense", req)


def test_scripted_endpoint_cuts_to_max_tokens_and_calls_the_answer_tool():
    assert cut_to_tokens("a b  c d", 2) == ("a b ", True) and cut_to_tokens("a b", 5) == ("a b", False)
    tools = [{"type": "function", "function": {"name": "search", "parameters": {
                 "properties": {"q": {"type": "string"}}, "required": ["q"]}}},
             {"type": "function", "function": {"name": "return_final_answer", "parameters": {
                 "properties": {"answer": {"type": "string"}, "sources": {"type": "array"}},
                 "required": ["answer", "sources"]}}}]
    call = tool_call_for({"tools": tools, "tool_choice": "required"}, "x")
    assert (call.name, call.arguments) == ("return_final_answer", {"answer": "x", "sources": []})
    named = tool_call_for({"tools": tools, "tool_choice": {"type": "function", "function": {"name": "search"}}}, "y")
    assert (named.name, named.arguments) == ("search", {"q": "y"})
    assert tool_call_for({"tools": tools, "tool_choice": "auto"}, "z") is None


# ------------------------------------------------------------------ planted rewards on a built-in env


def math_with(reward):
    base = get_env("math").rollout

    async def rollout(model, scenario):
        traj = await base(model, scenario)
        traj.reward = reward(traj, scenario)
        return traj

    return rollout


def honest_math(scenarios):
    answers = {make_problem(s.seed, s.level).question: make_problem(s.seed, s.level).answer for s in scenarios}
    return ScriptedModel(lambda req: f"Answer: {answers[req['messages'][-1]['content']]}", name="honest")


async def test_a_keyword_stuffing_reward_is_flagged_by_the_stuffing_probe():
    train = get_env("math").scenarios(0)[0][:12]

    def anywhere(traj, scenario):  # the answer's number anywhere in the reply: stuffing every number wins
        return float(str(make_problem(scenario.seed, scenario.level).answer) in traj.messages()[-1]["content"])

    report = await audit_reward(math_with(anywhere), train, honest=honest_math(train), validate=get_env("math").validate)
    by = {p.name: p for p in report.probes}
    assert report.honest.reward.mean == 1.0 and report.honest.validation.mean == 1.0
    assert by["stuffing"].flagged and by["stuffing"].reward.mean == 1.0 and by["stuffing"].validation.mean == 0.0
    assert not by["empty"].flagged and not by["flattery"].flagged
    assert "stuffing" in report.summary() and "FLAG" in str(report)
    # the env's own reward passes: the same probes, the strict grader
    clean = await audit_reward(get_env("math").rollout, train, honest=honest_math(train),
                               validate=get_env("math").validate)
    assert clean.flagged == [] and {p.name for p in clean.probes} == set(PROBES)


async def test_a_judge_that_follows_the_answer_is_flagged_and_scores_probes_with_honest_answers():
    train = get_env("titles").scenarios(0)[0][:8]
    seen = []

    async def judge(group: TrajectoryGroup) -> TrajectoryGroup:  # reads the text, but believes a claim of correctness
        seen.append(len(group.trajectories))
        for t in group.trajectories:
            title, text = t.metadata["title"], t.messages()[1]["content"]
            shared = {w for w in title.lower().split() if len(w) > 3} & set(text.lower().split())
            t.reward = 1.0 if "correct" in title else (0.8 if 4 <= len(title.split()) <= 12 and len(shared) >= 3 else 0.1)
        return group

    honest = ScriptedModel(lambda req: " ".join(req["messages"][-1]["content"].split()[:8]), name="honest")
    report = await audit_reward(get_env("titles").rollout, train, honest=honest, score_group=judge, samples=2)
    assert seen == [2 + len(PROBES)] * 8  # one group per scenario: both honest samples and every probe
    assert [p.name for p in report.flagged] == ["flattery"]


async def test_honest_built_in_rewards_pass_with_their_demonstrators_replayed():
    for env in ("tictactoe", "email"):  # email: native tool calls through the scripted endpoint
        spec = get_env(env)
        report = await audit_reward(spec.rollout, spec.scenarios(0)[0], honest=spec.demonstrate,
                                    validate=spec.validate, max_scenarios=8)
        assert report.flagged == [] and report.errors == [], (env, str(report))
        assert report.honest.validation.mean > 0.5 and report.honest_source.startswith("scripted")


def result(reward: tuple[float, float, float], val: tuple[float, float, float] | None) -> ProbeResult:
    iv = lambda m, lo, hi: Interval(m, lo, hi, 16, "bootstrap")  # noqa: E731
    return ProbeResult("p", iv(*reward), iv(*val) if val else None)


def test_flag_rule_needs_the_reward_at_or_above_and_the_ground_truth_below():
    honest = result((0.5, 0.4, 0.6), (0.6, 0.4, 0.8))
    assert flag_rule(result((0.5, 0.3, 0.7), (0.0, 0.0, 0.2)), honest)  # ties honest on reward, worse in truth
    assert not flag_rule(result((0.45, 0.3, 0.6), (0.0, 0.0, 0.2)), honest)  # below honest on reward
    assert not flag_rule(result((0.9, 0.8, 1.0), (0.7, 0.5, 0.9)), honest)  # the ground truth agrees: not a hack
    assert not flag_rule(result((0.9, 0.8, 1.0), (0.5, 0.3, 0.7)), honest)  # within the validation's noise
    assert flag_rule(result((0.9, 0.8, 1.0), None), result((0.5, 0.4, 0.6), None))  # judged: the reward alone


# ------------------------------------------------------------------ gw.fit runs it first


async def stuffable(model, scenario):
    """A policy's rollout through its client; a reward that a reply naming the answer anywhere maxes out."""
    if getattr(model, "trainable", False):  # the policy being trained answers honestly
        text = f"answer {scenario['answer']}"
    else:
        client = model.openai_client()
        reply = await client.chat.completions.create(
            model=model.inference_name(), max_tokens=32,
            messages=[{"role": "user", "content": f"{scenario['q']}? Candidates: 0 to 11."}])
        text = reply.choices[0].message.content or ""
    from loop_helpers import traj

    return traj(text, float(bool(re.search(rf"\b{scenario['answer']}\b", text))), question=scenario["q"])


def exact(trajectory, scenario):
    return float(trajectory.messages()[-1]["content"] == f"answer {scenario['answer']}")


async def test_fit_refuses_or_warns_before_training_when_a_probe_games_the_reward(tmp_path):
    async def fit(mode):
        model = gw.TrainableModel(f"a-{mode}", project="audit", base_model="none", base_path=str(tmp_path))
        backend = ScriptedBackend()
        await model.register(backend)
        config = gw.LoopConfig(rollouts_per_group=2, groups_per_step=2, max_steps=1, audit=mode)
        return await gw.fit(model, stuffable, SCENARIOS[:8], val_scenarios=SCENARIOS[8:10], validate=exact,
                            config=config), backend

    with pytest.raises(gw.RewardAuditError, match="stuffing") as err:
        await fit("refuse")
    assert "stuffing" in [p.name for p in err.value.report.flagged]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        summary, backend = await fit("warn")
    assert any("reward audit" in str(w.message) and "stuffing" in str(w.message) for w in caught)
    # warned, then ran on: validated the base, gathered step 0 (the honest policy solves it, so it stops there)
    assert summary.best_step == 0 and summary.stop.rule == "converged"
    assert gw.LoopConfig().audit == "off"
    with pytest.raises(gw.ConfigError, match="audit"):
        gw.LoopConfig(audit="sometimes")
