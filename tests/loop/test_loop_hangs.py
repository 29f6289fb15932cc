"""Hang detection: a rollout or a judge call that makes no progress for `hang_after_s` is named (its
scenario, group, last request and that request's age, its task's stack) in a warning and in a ``hang``
alert of the run's history, which the dashboard lists, while the run goes on; the rollout's timeout then
applies as before. Before, "training is stuck" was a progress bar one short of its end, and which of
the rollouts hung, and where, was found by hand."""

from __future__ import annotations

import asyncio
import logging

import httpx
import pytest
from loop_helpers import SCENARIOS, ScriptedBackend

import groupwise as gw
from groupwise import Trajectory, TrajectoryGroup, gather_trajectory_groups
from groupwise.backend.base import InferenceEndpoint
from groupwise.dashboard.runs import curves
from groupwise.rollout.hangs import note_progress


def chat_completion(request: httpx.Request) -> httpx.Response:
    """The model's side of the HTTP seam: every request answered with one short completion."""
    return httpx.Response(200, json={
        "id": "chatcmpl-1", "object": "chat.completion", "created": 0, "model": "m",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "42"}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}})


class AnsweringBackend(ScriptedBackend):
    """The scripted backend, with an endpoint whose requests get an answer (through the openai SDK and
    groupwise's client, as a real endpoint's)."""

    def __init__(self, handler=chat_completion) -> None:
        super().__init__()
        self.handler = handler
        self.exceptions: list[list[str]] = []
        self.messages: list[list[str]] = []

    def inference_endpoint(self, model) -> InferenceEndpoint:
        return InferenceEndpoint(base_url="http://answering.invalid/v1", api_key="none",
                                 http_client=httpx.AsyncClient(transport=httpx.MockTransport(self.handler)))

    async def train(self, model, groups, config, *, cursor=None):
        self.exceptions.append([e.type for g in groups for e in g.exceptions])
        self.messages.append([e.message for g in groups for e in g.exceptions])
        return await super().train(model, groups, config, cursor=cursor)


async def wait_for_a_tool_that_never_answers() -> None:
    await asyncio.Event().wait()


def hanging_rollout(hang_on: int):
    """Asks the model once; the rollout of scenario `hang_on` then waits forever on its "tool"."""
    hung: list[int] = []
    calls: dict[int, int] = {}

    async def rollout(model, scenario):
        calls[scenario["id"]] = nth = calls.get(scenario["id"], 0) + 1
        client = model.openai_client()
        answer = await client.chat.completions.create(model=model.inference_name(),
                                                      messages=[{"role": "user", "content": scenario["q"]}])
        if scenario["id"] == hang_on and not hung:
            hung.append(1)
            await wait_for_a_tool_that_never_answers()
        note_progress()
        return Trajectory(messages_and_choices=[{"role": "user", "content": scenario["q"]}, answer.choices[0]],
                          reward=float(nth % 2))  # a group's two rollouts differ

    return rollout


async def fit(tmp_path, rollout, score_group=None, **config):
    model = gw.TrainableModel("hangs", project="loop", base_model="none", base_path=str(tmp_path))
    backend = AnsweringBackend()
    await model.register(backend)
    config = gw.LoopConfig(rollouts_per_group=2, groups_per_step=3, max_steps=2, eval_every=10, patience=100,
                           seed_rollouts=False, **config)
    summary = await gw.fit(model, rollout, SCENARIOS[:6], config=config, score_group=score_group)
    return model, backend, summary


def hang_alerts(model) -> list[dict]:
    return [r for r in model.store.run_history.events("alert") if r.get("name") == "hang"]


async def test_a_hung_rollout_is_named_before_its_timeout_and_the_others_complete(tmp_path, caplog):
    caplog.set_level(logging.WARNING, logger="groupwise.loop")
    model, backend, summary = await fit(tmp_path, hanging_rollout(hang_on=1), max_exceptions=1,
                                        hang_after_s=0.2, rollout_timeout_s=3.0)
    # the timeout policy applied afterwards, unchanged: the hung rollout counted as one exception, and
    # the run trained on every other rollout
    assert summary.final_step == 2
    assert backend.exceptions[0] == ["RolloutTimeoutError"] and backend.exceptions[1] == []
    # the timeout's own message says what it asked last too
    assert "Its last model request: POST /chat/completions model=hangs, sent" in backend.messages[0][0]
    assert "answered." in backend.messages[0][0] and "never answered" not in backend.messages[0][0]
    [alert] = hang_alerts(model)
    ev = alert["evidence"]
    assert alert["step"] == 0 and alert["severity"] == "warning"
    assert ev["kind"] == "rollout" and ev["phase"] == "train step 0"
    assert ev["name"].startswith("rollout ") and "scenario_index 1" in ev["name"]
    assert "'id': 1" in ev["scenario"] and "'q': 'question 1'" in ev["scenario"]
    assert ev["last_request"] == "POST /chat/completions model=hangs" and ev["request_in_flight"] is False
    assert ev["idle_s"] >= 0.2 and ev["last_request_age_s"] >= ev["idle_s"]
    assert ev["idle_s"] < 3.0  # named within its timeout, before it was cancelled
    assert "wait_for_a_tool_that_never_answers" in ev["stack"] and "in rollout" in ev["stack"]
    # the CLI's line, while the run went on
    [line] = [r.getMessage() for r in caplog.records if "has made no progress" in r.getMessage()
              and r.name == "groupwise.loop"]  # once, on the logger `groupwise train` prints
    assert "scenario_index 1" in line and "rollout_timeout_s=3 from its start cancels it" in line
    assert "wait_for_a_tool_that_never_answers" in line
    # what the dashboard shows
    [shown] = [a for a in curves(model.store.run_dir)["alerts"] if a["name"] == "hang"]
    assert "scenario_index 1" in shown["message"] and shown["evidence"]["stack"] == ev["stack"]


async def test_a_rollout_waiting_on_the_model_is_named_with_its_unanswered_request(tmp_path):
    release = asyncio.Event()

    async def slow_model(request: httpx.Request) -> httpx.Response:
        await release.wait()
        return chat_completion(request)

    reports = []

    def on_hang(report):
        reports.append(report)
        release.set()  # the model answers once the hang is named: the rollout then completes

    model = gw.TrainableModel("slow", project="loop", base_model="none", base_path=str(tmp_path))
    await model.register(AnsweringBackend(slow_model))

    async def rollout(model, i: int, scenario: str) -> Trajectory:
        if i == 2:
            await model.openai_client().chat.completions.create(model="slow@3", messages=[{"role": "user", "content": "x"}])
        return Trajectory(messages_and_choices=[{"role": "user", "content": scenario}], reward=float(i))

    out = await gather_trajectory_groups([TrajectoryGroup(rollout(model, i, f"s{i}") for i in range(4))],
                                         pbar_desc=None, hang_after_s=0.1, rollout_timeout_s=30.0, on_hang=on_hang)
    assert out[0].rewards() == [0.0, 1.0, 2.0, 3.0] and not out[0].exceptions
    [report] = reports
    assert report.name == "rollout 2 of group 0" and report.scenario == "i=2, scenario='s2'"  # not the model
    assert report.last_request == "POST /chat/completions model=slow@3" and report.request_in_flight
    assert report.last_request_age_s >= report.idle_s >= 0.1
    assert "in rollout" in report.stack and "in slow_model" in report.stack
    assert "await release.wait()" in report.stack  # the line it waits on


async def test_a_hung_judge_call_is_named_and_the_run_goes_on_once_it_returns(tmp_path):
    model_ref = {}
    released = asyncio.Event()

    async def wait_for_a_judge_that_is_stuck() -> None:
        # stuck until its hang is in the run's history (then the test lets it go)
        while not hang_alerts(model_ref["model"]):
            await asyncio.sleep(0.05)
        released.set()

    async def score_group(group):
        if group.metadata.get("scenario_index") == 2 and not released.is_set():
            await wait_for_a_judge_that_is_stuck()
        return group

    model = gw.TrainableModel("hangs", project="loop", base_model="none", base_path=str(tmp_path))
    model_ref["model"] = model
    backend = AnsweringBackend()
    await model.register(backend)
    config = gw.LoopConfig(rollouts_per_group=2, groups_per_step=3, max_steps=1, eval_every=10, patience=100,
                           seed_rollouts=False, hang_after_s=0.2)
    summary = await gw.fit(model, hanging_rollout(hang_on=-1), SCENARIOS[:6], config=config, score_group=score_group)
    assert summary.final_step == 1
    [alert] = hang_alerts(model)
    ev = alert["evidence"]
    assert ev["kind"] == "judge" and ev["phase"] == "judge step 0"
    assert ev["name"] == f"score_group on group {ev['group']} (scenario_index 2)"  # its place in the batch
    assert "wait_for_a_judge_that_is_stuck" in ev["stack"] and "in score_group" in ev["stack"]
    assert ev["last_request"] is None  # the judge here makes none: the report says so


def test_the_setting_has_one_default_everywhere():
    import inspect

    from groupwise.config import HANG_AFTER_S
    from groupwise.errors import ConfigError

    assert gw.LoopConfig().hang_after_s == HANG_AFTER_S
    for fn in (gw.gather_trajectory_groups, gw.gather_trajectories, gw.trajectory_group):
        assert inspect.signature(fn).parameters["hang_after_s"].default == HANG_AFTER_S
    with pytest.raises(ConfigError, match="hang_after_s"):
        gw.LoopConfig(hang_after_s=0)


async def test_a_gather_without_a_listener_warns_on_its_own_logger(caplog):
    caplog.set_level(logging.WARNING, logger="groupwise.rollout.hangs")
    release = asyncio.Event()

    async def stuck_on_an_environment(release: asyncio.Event) -> Trajectory:
        await release.wait()
        return Trajectory(messages_and_choices=[{"role": "user", "content": "x"}], reward=0.0)

    def named() -> list[str]:
        return [r.getMessage() for r in caplog.records if "in stuck_on_an_environment" in r.getMessage()]

    async def releaser() -> Trajectory:
        while not named():  # the environment comes back once its hang is named
            await asyncio.sleep(0.02)
            note_progress()  # this one is busy (an environment's steps)
        release.set()
        return Trajectory(messages_and_choices=[{"role": "user", "content": "y"}], reward=1.0)

    out = await gather_trajectory_groups([TrajectoryGroup([stuck_on_an_environment(release)]),
                                          TrajectoryGroup([releaser()])], pbar_desc=None, hang_after_s=0.1)
    assert [g.rewards() for g in out] == [[0.0], [1.0]]
    [message] = named()  # once per idle spell
    assert message.startswith("rollout 0 of group 0 has made no progress")
    assert "scenario: release=<asyncio.locks.Event" in message
