"""verifiers environments, written as their authors write them, trained by gw.fit on the tiny random model.

Not collected by the main test run: verifiers pins what the dev extra cannot (openai < 3 in its latest
release, mcp < 2), so `tests/envs/test_verifiers_hub.py` runs this file in an environment of its own, with
verifiers and the openai 2.x SDK installed over the test venv's packages (it says how). Run by hand:
``<that env>/bin/python -m pytest -o python_files='cases_*.py' tests/envs/verifiers_cases``.
"""

from __future__ import annotations

import json
import re
import shlex

import openai
import pytest
import verifiers as vf
from datasets import Dataset

import groupwise as gw


def test_this_runs_on_the_openai_2_sdk_that_verifiers_pins():
    # the point of the separate environment: groupwise imports and trains under the 2.x SDK
    assert openai.__version__.startswith("2."), openai.__version__
    assert gw.envs.from_verifiers is not None


PROBLEMS = [{"question": f"What is {a} + {b}?", "answer": str(a + b)} for a in range(1, 5) for b in range(1, 5)]


def load_math_environment(**env_args) -> vf.Environment:
    """A single-turn math env as verifiers' examples write one: an XML parser, a rubric of a correctness
    reward, the parser's format reward and a length penalty, with weights."""
    parser = vf.XMLParser(["reasoning", "answer"], answer_field="answer")

    def correct_answer(completion, answer, **kwargs) -> float:
        return 1.0 if (parser.parse_answer(completion) or "").strip() == answer else 0.0

    def brevity(completion, **kwargs) -> float:
        text = completion[-1]["content"] if completion else ""
        return 1.0 / (1.0 + len(re.findall(r"\S+", text or "")))

    rubric = vf.Rubric(funcs=[correct_answer, parser.get_format_reward_func(), brevity], weights=[1.0, 0.2, 0.5],
                       parser=parser)
    return vf.SingleTurnEnv(
        dataset=Dataset.from_list(PROBLEMS),
        system_prompt=f"Think step by step, then answer. Respond in the format:\n{parser.get_format_str()}",
        few_shot=[{"role": "user", "content": "What is 2 + 2?"},
                  {"role": "assistant", "content": "<reasoning>2 and 2 make 4</reasoning>\n<answer>4</answer>"}],
        parser=parser, rubric=rubric, **env_args,
    )


def load_environment(**kwargs) -> vf.Environment:
    """What `groupwise train verifiers:cases_verifiers` loads, as a verifiers env module exposes it."""
    return load_math_environment(sampling_args={"max_tokens": 6})


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: the first integer
        b: the second integer
    """
    return a + b


def load_tool_environment() -> vf.Environment:
    """A multi-turn tool env: the model calls `add` (tool_choice forces a call each turn, so the tiny random
    model runs the whole protocol: tool call, the env's tool message, the next turn) until max_turns."""

    def used_the_result(completion, answer, **kwargs) -> float:
        tool_results = [m["content"] for m in completion if m["role"] == "tool"]
        return 1.0 if answer in tool_results else 0.0

    def concise(completion, **kwargs) -> float:  # fewer characters written, calls included
        written = [str(m["content"] or "") + "".join(c["arguments"] for c in (m.get("tool_calls") or []))
                   for m in completion if m["role"] == "assistant"]
        return 1.0 / (1.0 + sum(len(w) for w in written) / 10)

    return vf.ToolEnv(
        dataset=Dataset.from_list(PROBLEMS),
        system_prompt="Use the add tool to compute the sum.",
        tools=[add], max_turns=2,
        rubric=vf.Rubric(funcs=[used_the_result, concise], weights=[1.0, 0.5]),
        sampling_args={"tool_choice": "required"},
    )


class GuessEnv(vf.MultiTurnEnv):
    """A multi-turn env of its own protocol: the env answers each guess until it is right or max_turns."""

    async def env_response(self, messages, state, **kwargs):
        guess = (messages[-1]["content"] or "").strip()
        return [{"role": "user", "content": "Right." if guess == state["answer"] else f"Not {guess[:10]!r}; again."}]


class ForgetfulGuessEnv(GuessEnv):
    """The same game, but each turn's request holds only the system prompt and the latest feedback (an env
    that rewrites its context, as summarising or windowing envs do)."""

    async def get_prompt_messages(self, state):
        messages = await super().get_prompt_messages(state)
        return [messages[0], messages[-1]] if state["trajectory"] else messages


def guess_rubric():
    def length_reward(completion, **kwargs) -> float:
        return 1.0 / (1.0 + sum(len(str(m["content"] or "")) for m in completion if m["role"] == "assistant"))

    return vf.Rubric(funcs=[length_reward])


async def test_a_multi_turn_env_runs_its_own_turns_and_a_rewritten_context_is_its_own_history(tiny_model_dir, tmp_path):
    dataset = Dataset.from_list(PROBLEMS)
    model = gw.TrainableModel(name="guess", project="vf", base_model=tiny_model_dir)
    backend = gw.LocalBackend(path=str(tmp_path), best_checkpoint_metric=None)
    await model.register(backend)
    try:
        linear = gw.envs.from_verifiers(GuessEnv(dataset=dataset, system_prompt="Guess.", max_turns=3,
                                                 rubric=guess_rubric()), max_tokens=4)
        scenario = linear.scenarios(0)[1][0]
        kept = await linear.rollout(model, scenario)
        forgetful = gw.envs.from_verifiers(ForgetfulGuessEnv(dataset=dataset, system_prompt="Guess.", max_turns=3,
                                                             rubric=guess_rubric()), max_tokens=4)
        rewritten = await forgetful.rollout(model, scenario)
    finally:
        await backend.close()
    # the tiny model never says the sum: three turns, each answered by the env's own feedback
    assert [m["role"] for m in kept.messages()] == ["system", "user", "assistant", "user", "assistant", "user",
                                                    "assistant"]
    assert kept.messages()[3]["content"].startswith("Not ") and not kept.additional_histories
    assert kept.metrics["turns"] == 3 and kept.reward == pytest.approx(kept.metrics["length_reward"])
    # a request that does not continue the previous one starts a history of its own: each holds exactly the
    # context its Choice was sampled in
    assert len(rewritten.additional_histories) == 2
    for history in rewritten.additional_histories:
        assert [m["role"] for m in history.messages()] == ["system", "user", "assistant"]
        assert history.messages()[1]["content"].startswith("Not ")


class BrokenSetupEnv(vf.SingleTurnEnv):
    """An env whose own infrastructure fails before the model is asked (a sandbox that would not start)."""

    async def setup_state(self, state):
        raise vf.InfraError("the sandbox did not start")


async def test_an_empty_reply_is_scored_and_kept_and_an_env_failure_raises(tiny_model_dir, tmp_path):
    # verifiers ends a rollout whose reply is empty with EmptyModelResponseError in its state. That reply is
    # the policy's own: it is scored by the rubric and kept, token ids and all, so GRPO can discourage it.
    # The model really replies nothing here: greedy, with its own first token as the stop string.
    model = gw.TrainableModel(name="empty", project="vf", base_model=tiny_model_dir)
    backend = gw.LocalBackend(path=str(tmp_path), best_checkpoint_metric=None)
    await model.register(backend)
    try:
        plain = gw.envs.from_verifiers(load_math_environment(), val_size=2, test_size=2)
        scenario = plain.scenarios(0, max_tokens=1)[1][0].model_copy(update={"temperature": 0.0})
        first = (await plain.rollout(model, scenario)).messages_and_choices[-1].message.content
        assert first, "the tiny model's greedy first token decodes to text"
        stopped = gw.envs.from_verifiers(load_math_environment(), val_size=2, test_size=2,
                                         sampling_args={"stop": [first]})
        trajectory = await stopped.rollout(model, scenario.model_copy(update={"max_tokens": 4}))
        with pytest.raises(gw.errors.EnvError, match="InfraError.*sandbox did not start"):
            await gw.envs.from_verifiers(BrokenSetupEnv(dataset=Dataset.from_list(PROBLEMS), rubric=guess_rubric()),
                                         val_size=2, test_size=2).rollout(model, scenario)
    finally:
        await backend.close()
    choice = trajectory.messages_and_choices[-1]
    assert not isinstance(choice, dict) and choice.message.content == "" and choice.finish_reason == "stop"
    assert trajectory.metrics["model_error"] == 1.0 and "EmptyModelResponseError" in trajectory.metadata["error"]
    assert trajectory.metrics["correct_answer"] == 0.0 and trajectory.metrics["turns"] == 1
    m = trajectory.metrics
    assert trajectory.reward == pytest.approx(m["correct_answer"] + 0.2 * m["format_reward_func"] + 0.5 * m["brevity"])


async def test_a_single_turn_env_with_a_rubric_trains_two_steps(tiny_model_dir, tmp_path, fit_two_steps):
    env = load_math_environment()
    spec = gw.envs.from_verifiers(env, val_size=2, test_size=2)
    train, val, test = spec.scenarios(0)
    assert (len(train), len(val), len(test)) == (12, 2, 2)  # held out from the end of the dataset
    assert {s.row["question"] for s in val + test}.isdisjoint({s.row["question"] for s in train})
    steps, trajectory = await fit_two_steps(tiny_model_dir, tmp_path, spec, "math", max_tokens=12)
    for name in ("correct_answer", "format_reward_func", "brevity"):
        assert any(name in key for key in steps[0]), (name, sorted(steps[0]))
    # the trajectory is the env's conversation: its system prompt, its few-shot, the question, the sampled
    # Choice (token ids kept for the trainer); the reward is the rubric's weighted sum of its functions
    messages = trajectory.messages()
    assert messages[0]["role"] == "system" and "Think step by step" in messages[0]["content"]
    assert messages[1]["content"] == "What is 2 + 2?" and messages[3]["content"].startswith("What is")
    assert not isinstance(trajectory.messages_and_choices[-1], dict)  # the Choice itself
    m = trajectory.metrics
    assert trajectory.reward == pytest.approx(1.0 * m["correct_answer"] + 0.2 * m["format_reward_func"]
                                              + 0.5 * m["brevity"])
    assert m["brevity"] > 0 and m["turns"] == 1


async def test_a_multi_turn_tool_env_trains_two_steps(tiny_model_dir, tmp_path, fit_two_steps):
    spec = gw.envs.from_verifiers(load_tool_environment(), val_size=2, test_size=2)
    steps, trajectory = await fit_two_steps(tiny_model_dir, tmp_path, spec, "tools", max_tokens=40)
    for name in ("used_the_result", "concise", "total_tool_calls", "add_calls"):
        assert any(name in key for key in steps[0]), (name, sorted(steps[0]))
    # two turns, each a forced call of `add`, each answered by the env's tool message (the protocol ran)
    assert trajectory.metrics["turns"] == 2 and trajectory.metrics["add_calls"] == 2
    roles = [m["role"] for m in trajectory.messages()]
    assert roles == ["system", "user", "assistant", "tool", "assistant"]
    assert trajectory.tools and trajectory.tools[0]["function"]["name"] == "add"
    call = trajectory.messages()[2]["tool_calls"][0]
    assert trajectory.messages()[3]["content"] == str(add(**json.loads(call["function"]["arguments"])))
    assert trajectory.reward == pytest.approx(trajectory.metrics["used_the_result"]
                                              + 0.5 * trajectory.metrics["concise"])


async def test_a_judge_rubric_is_pointed_at_the_judge_groupwise_resolves(tiny_model_dir, tmp_path):
    # A JudgeRubric written for a hosted judge asks the local model instead: its client is the one groupwise
    # resolved (here the trained model's own client, judging with the base weights as name@0).
    rubric = vf.JudgeRubric(judge_client=openai.AsyncOpenAI(api_key="unused", base_url="http://127.0.0.1:9"))

    async def judged(judge, prompt, completion, answer, state, **kwargs) -> float:
        verdict = await judge(prompt, completion, answer, state)
        return 1.0 if "yes" in verdict.lower() else 0.0

    rubric.add_reward_func(judged)
    env = vf.SingleTurnEnv(dataset=Dataset.from_list(PROBLEMS), rubric=rubric)
    model = gw.TrainableModel(name="judged", project="vf", base_model=tiny_model_dir)
    backend = gw.LocalBackend(path=str(tmp_path), best_checkpoint_metric=None)
    await model.register(backend)
    try:
        spec = gw.envs.from_verifiers(env, judge="judged@0", judge_client=model.openai_client())
        assert rubric.judge_model == "judged@0" and rubric.judge_client is not None
        trajectory = await spec.rollout(model, spec.scenarios(0, max_tokens=4)[1][0])
    finally:
        await backend.close()
    assert trajectory.metrics["judged"] in (0.0, 1.0)
    with pytest.raises(gw.errors.EnvError, match="no JudgeRubric"):
        gw.envs.from_verifiers(load_math_environment(), judge="judged@0", judge_client=object())


def test_groupwise_train_runs_a_verifiers_env_named_by_its_module(tiny_model_dir, tmp_path, capsys, monkeypatch):
    from groupwise.cli import main

    monkeypatch.chdir(tmp_path)
    code = main(["train", "verifiers:cases_verifiers", "--model", tiny_model_dir, "--steps", "1", "--path", "runs",
                 "--device", "cpu", "--rollouts-per-group", "2", "--groups-per-step", "2"])
    out, err = capsys.readouterr()
    assert code == 0, out + err
    assert "env=verifiers-cases_verifiers" in out and "train/val/test=8/4/4" in out
    assert "[groupwise train] step 1/1 · reward" in out
    run = tmp_path / "runs" / "verifiers-cases_verifiers" / "models" / "verifiers-cases_verifiers-s0"
    assert (run / "summary.json").exists()
    # the command it prints to train longer names the env as the CLI takes it, and continues this run
    again = re.search(r"`groupwise train (verifiers:cases_verifiers [^`]*) --steps \d+` continues this run from step 1", out)
    assert again, out
    code = main(["train", *shlex.split(again.group(1)), "--steps", "2"])
    out, err = capsys.readouterr()
    assert code == 0, out + err
    assert "[groupwise train] step 2/2 · reward" in out and "step 1/" not in out
