"""verifiers 0.4's v1 tasksets, written as their authors write them, trained by gw.fit on the tiny random model.

Not collected by the main test run: verifiers 0.4 pins openai < 3 and mcp == 2.0.0, so
`tests/envs/test_verifiers_hub.py` runs this file in an environment of its own (it says how), with `uv` on
the PATH: v1's harness is a PEP 723 script that its subprocess runtime prepares with `uv`. The tasksets are
modules of this folder (`v1_sums`, `v1_tools`): v1 loads a taskset, and launches a task's tool server, by
module name. Run by hand: ``<that env>/bin/python -m pytest -o python_files='cases_*.py'
tests/envs/verifiers_v1_cases`` with that env's bin on the PATH and this folder on PYTHONPATH.
"""

from __future__ import annotations

import json

import openai
import pytest
import verifiers
import verifiers.v1 as vf

import groupwise as gw
from groupwise.core.choices import choice_token_ids
from v1_broken import BrokenTaskset
from v1_sums import SYSTEM, SumTaskset
from v1_tools import AddTaskset


def test_this_runs_verifiers_0_4_on_the_openai_2_sdk():
    assert openai.__version__.startswith("2.") and verifiers.__version__.startswith("0.4"), (
        openai.__version__, verifiers.__version__)


async def test_a_single_turn_taskset_with_rewards_and_a_metric_trains_two_steps(tiny_model_dir, tmp_path,
                                                                              fit_two_steps):
    spec = gw.envs.from_verifiers(SumTaskset, val_size=2, test_size=2)
    train, val, test = spec.scenarios(0)
    assert (len(train), len(val), len(test)) == (12, 2, 2)  # held out from the end of the taskset
    assert {s.index for s in val + test} == {12, 13, 14, 15} and val[0].prompt == "What is 4 + 1?"
    steps, trajectory = await fit_two_steps(tiny_model_dir, tmp_path, spec, "sums", max_tokens=8)
    for name in ("exact", "brevity", "reply_chars"):
        assert any(name in key for key in steps[0]), (name, sorted(steps[0]))
    # the conversation v1's harness sent (the task's system prompt and prompt), then the Choice as
    # groupwise's server returned it (its sampled token ids, what GRPO trains on)
    assert trajectory.messages()[:2] == [{"role": "system", "content": SYSTEM},
                                         {"role": "user", "content": "What is 4 + 1?"}]
    choice = trajectory.messages_and_choices[-1]
    assert not isinstance(choice, dict) and 0 < len(choice_token_ids(choice)) <= 8
    # the reward is v1's: each @vf.reward's score times its weight; the @vf.metric beside them
    m = trajectory.metrics
    assert trajectory.reward == pytest.approx(1.0 * m["exact"] + 0.5 * m["brevity"])
    assert m["brevity"] > 0 and m["turns"] == 1 and trajectory.metadata["stop_condition"]


async def test_a_multi_turn_taskset_with_an_mcp_tool_trains_two_steps(tiny_model_dir, tmp_path, fit_two_steps):
    # tool_choice "required" makes the tiny random model call the tool each turn, so the whole protocol runs:
    # the harness's MCP tool call, the toolset's result, the next turn, the task's @vf.stop after two
    spec = gw.envs.from_verifiers(AddTaskset, val_size=2, test_size=2, sampling_args={"tool_choice": "required"})
    steps, trajectory = await fit_two_steps(tiny_model_dir, tmp_path, spec, "tools", max_tokens=40)
    for name in ("used_the_result", "right_operands", "tool_results"):
        assert any(name in key for key in steps[0]), (name, sorted(steps[0]))
    assert trajectory.metrics["turns"] == 2 and trajectory.metadata["stop_condition"] == "two_turns"
    assert [m["role"] for m in trajectory.messages()] == ["user", "assistant", "tool", "assistant"]
    assert trajectory.tools and trajectory.tools[0]["function"]["name"] == "calc_add"
    call = trajectory.messages()[1]["tool_calls"][0]["function"]
    args = json.loads(call["arguments"])
    assert call["name"] == "calc_add" and trajectory.messages()[2]["content"] == str(args["a"] + args["b"])
    assert trajectory.metrics["tool_results"] == 1.0
    m = trajectory.metrics
    assert trajectory.reward == pytest.approx(m["used_the_result"] + 0.5 * m["right_operands"])
    assert m["right_operands"] == (float(args["a"] == 4) + float(args["b"] == 1)) / 2  # the task asks 4 + 1


async def test_a_rollout_whose_reward_failed_is_an_env_error_not_a_zero(tiny_model_dir, tmp_path):
    spec = gw.envs.from_verifiers(BrokenTaskset, val_size=1, test_size=1)
    model = gw.TrainableModel(name="broken", project="vf1", base_model=tiny_model_dir)
    backend = gw.LocalBackend(path=str(tmp_path), best_checkpoint_metric=None)
    await model.register(backend)
    try:
        with pytest.raises(gw.errors.EnvError, match="episode failed:.*no 'expected' field"):
            await spec.rollout(model, spec.scenarios(0, max_tokens=4)[0][0])
    finally:
        await backend.close()


def test_an_env_whose_agent_runs_in_a_remote_sandbox_is_refused_saying_what_to_do():
    env = vf.SingleAgentEnv(vf.SingleAgentEnvConfig(taskset=vf.TasksetConfig(id="v1_sums")))  # v1's default: prime
    with pytest.raises(gw.errors.EnvError, match=r"'prime' runtime.*SubprocessConfig"):
        gw.envs.from_verifiers(env)
    with pytest.raises(gw.errors.EnvError, match="JudgeConfig"):
        gw.envs.from_verifiers(SumTaskset, judge="local/x")
    # a taskset instance (its config without an id) is found by its module, and num_tasks takes its first N
    spec = gw.envs.from_verifiers(SumTaskset(vf.TasksetConfig()), num_tasks=8, val_size=2, test_size=2)
    assert spec.name == "verifiers:v1_sums" and [len(s) for s in spec.scenarios(0)] == [4, 2, 2]


def test_groupwise_train_runs_a_v1_taskset_named_by_its_module(tiny_model_dir, tmp_path, capsys, monkeypatch):
    from groupwise.cli import main

    monkeypatch.chdir(tmp_path)
    code = main(["train", "verifiers:v1_sums", "--model", tiny_model_dir, "--steps", "1", "--path", "runs",
                 "--device", "cpu", "--rollouts-per-group", "2", "--groups-per-step", "2"])
    out, err = capsys.readouterr()
    assert code == 0, out + err
    assert "env=verifiers-v1_sums" in out and "train/val/test=8/4/4" in out
    assert "[groupwise train] step 1/1 · reward" in out
    run = tmp_path / "runs" / "verifiers-v1_sums" / "models" / "verifiers-v1_sums-s0"
    assert (run / "summary.json").exists()
