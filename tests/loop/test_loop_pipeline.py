"""The asynchronous loop (loop/pipeline.py) on a scripted backend: the schedule, the staleness bound, late
groups, and a run killed while batches were gathered ahead resumes to the history of an uninterrupted one."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from history_rows import stable_rows
from pipeline_helpers import TRAIN, run

import groupwise as gw
from groupwise.runs.series import events, rows

HERE = Path(__file__).parent


async def test_batches_come_from_the_policy_d_steps_back_and_staleness_is_logged(tmp_path):
    log = tmp_path / "rollouts.log"
    summary, backend = await run(str(tmp_path / "run"), log_path=log)
    assert summary.final_step == 6
    h = gw.load_history(summary.run_dir)
    loop_rows = rows(h, "loop")
    # d = 2: steps 0..2 train on the base's rollouts, then step k on policy k - 2
    assert [r["pipeline/policy"] for r in loop_rows] == [0, 0, 0, 1, 2, 3]
    assert [r["pipeline/staleness_mean"] for r in loop_rows] == [0, 1, 2, 2, 2, 2]
    assert all(r["pipeline/staleness_max"] <= 2 and r["pipeline/late_groups"] == 0 for r in loop_rows)
    # every training rollout asked for its batch's scheduled policy
    versions = [int(line.split()[0]) for line in log.read_text().splitlines()]
    assert sorted(set(versions)) == [0, 1, 2, 3]
    # the data order is the synchronous loop's: the same scenarios, step by step
    sync_summary, sync_backend = await run(str(tmp_path / "sync"), max_steps_off_policy=0)
    assert backend.trained_on == sync_backend.trained_on
    assert [r["step"] for r in rows(h, "val")] == [0, 2, 4, 6]
    # the gathered-ahead batches that a stop made useless are recorded: none here (max_steps bounds the reads)
    assert [a for a in events(h, "alert") if a["name"] == "pipeline_abandoned"] == []


async def test_a_stop_records_the_batches_gathered_ahead(tmp_path):
    summary, _ = await run(str(tmp_path / "run"), max_steps=None, target=0.35)  # val 0.2 + 0.1 k: stops at step 2
    h = gw.load_history(summary.run_dir)
    assert summary.stop.rule == "target" and summary.final_step == 2
    abandoned = [a for a in events(h, "alert") if a["name"] == "pipeline_abandoned"]
    assert [a["evidence"]["steps"] for a in abandoned] == [[2, 3, 4]]


def sampled(text: str, versions: list[int]):
    """A Choice as groupwise's server returns it: the policy version of each of its tokens attached."""
    from openai.types.chat.chat_completion import Choice
    from openai.types.chat.chat_completion_message import ChatCompletionMessage

    return Choice(index=0, finish_reason="stop", message=ChatCompletionMessage(role="assistant", content=text),
                  policy_versions=versions)


async def test_groups_sampled_by_a_too_old_policy_are_left_out_and_counted(tmp_path):
    from loop_helpers import ScriptedBackend

    flip = iter(range(10**6))

    async def stubborn(model, scenario):
        # scenario 0's rollouts always ask the base (step 0), whatever policy they are handed: their tokens
        # say so (policy_versions), and from step 2 on they are more than max_steps_off_policy=1 old
        name = model.inference_name()
        handed = int(name.rsplit("@", 1)[1]) if "@" in name else 0
        version = 0 if scenario["id"] == 0 else handed
        choice = sampled(f"answer after {version} steps", [version] * 3)
        return gw.Trajectory(messages_and_choices=[{"role": "user", "content": scenario["q"]}, choice],
                             reward=float(next(flip) % 2))

    model = gw.TrainableModel("late", project="loop", base_model="none", base_path=str(tmp_path))
    await model.register(ScriptedBackend())
    summary = await gw.fit(model, stubborn, TRAIN[:4],
                           config=gw.LoopConfig(rollouts_per_group=2, groups_per_step=4, max_steps=4, patience=100,
                                                num_epochs=4, max_steps_off_policy=1))
    h = gw.load_history(summary.run_dir)
    loop_rows = rows(h, "loop")
    assert [r["pipeline/late_groups"] for r in loop_rows] == [0, 0, 1, 1]  # step k trains policy k-1's batch
    alerts = [a for a in events(h, "alert") if a["name"] == "late_groups"]
    assert [a["step"] for a in alerts] == [2, 3] and all(a["evidence"]["groups"] == [0] for a in alerts)
    assert [a["evidence"]["staleness_max"] for a in alerts] == [[2], [3]]
    assert [r["n_trajectories"] for r in rows(h, "train")] == [8, 8, 6, 6]  # the late group was not trained on
    # the admitted groups' tokens are exactly one version old from step 1 on
    assert [r["pipeline/staleness_max"] for r in loop_rows] == [0, 1, 1, 1]


def test_a_run_killed_mid_pipeline_resumes_to_the_history_of_an_uninterrupted_one(tmp_path):
    crashed, clean = tmp_path / "crashed", tmp_path / "clean"
    log_crash, log_clean = tmp_path / "crash.log", tmp_path / "clean.log"
    # SIGKILLed in step 4's validation: steps 0-3 trained, the batches of steps 4 and 5 gathered ahead
    proc = subprocess.run([sys.executable, str(HERE / "pipeline_helpers.py"), str(crashed), "4", str(log_crash)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == -9, proc.stderr[-2000:]
    state = json.loads((crashed / "loop" / "models" / "piped" / "state.json").read_text())
    assert state["scripted_step"] == 4
    ahead = {int(line.split()[0]) for line in log_crash.read_text().splitlines()}
    assert ahead == {0, 1, 2, 3}  # policies 2 and 3 (steps 4 and 5's batches) sampled before the kill
    import asyncio

    summary, _ = asyncio.run(run(str(crashed), log_path=log_crash))
    assert summary.start_step == state["scripted_step"] and summary.final_step == 6
    clean_summary, _ = asyncio.run(run(str(clean), log_path=log_clean))
    assert stable_rows(gw.load_history(summary.run_dir)) == stable_rows(gw.load_history(clean_summary.run_dir))
    # every trained batch came from the same policies in both runs
    crashed_groups = [(s, sorted(t.messages()[-1]["content"] for g in gw.load_trajectories(summary.run_dir, "train", s)
                                 for t in g)) for s in range(6)]
    clean_groups = [(s, sorted(t.messages()[-1]["content"] for g in gw.load_trajectories(clean_summary.run_dir, "train", s)
                               for t in g)) for s in range(6)]
    assert crashed_groups == clean_groups


def _claiming(version_for):
    """A rollout whose tokens say they were sampled by `version_for(handed)` (handed: the policy version of
    the model it was handed), rewards spread within a group."""
    flip = iter(range(10**6))

    async def rollout(model, scenario):
        name = model.inference_name()
        handed = int(name.rsplit("@", 1)[1]) if "@" in name else model.backend.step_of(model)
        version = version_for(handed)
        return gw.Trajectory(messages_and_choices=[{"role": "user", "content": scenario["q"]},
                                                   sampled(f"answer after {version} steps", [version] * 3)],
                             reward=float(next(flip) % 2))

    return rollout


async def test_a_regathered_batch_is_logged_with_the_policy_that_sampled_it(tmp_path):
    """A batch whose groups were all late is gathered again from the latest policy; its loop row named the
    scheduled policy instead, so the run's record said a batch came from a policy that never sampled it."""
    from loop_helpers import ScriptedBackend

    # the handed model is ignored for odd versions (the base answers): with d=1, step 2's batch (policy 1)
    # and step 4's (policy 3) are all late and are gathered again from policies 2 and 4
    model = gw.TrainableModel("regather", project="loop", base_model="none", base_path=str(tmp_path))
    await model.register(ScriptedBackend())
    summary = await gw.fit(model, _claiming(lambda v: 0 if v % 2 else v), TRAIN[:4],
                           config=gw.LoopConfig(rollouts_per_group=2, groups_per_step=4, max_steps=6, patience=100,
                                                num_epochs=6, max_steps_off_policy=1))
    loop_rows = rows(gw.load_history(summary.run_dir), "loop")
    assert [r["pipeline/policy"] for r in loop_rows] == [0, 0, 2, 2, 4, 4]
    assert [r["pipeline/staleness_max"] for r in loop_rows] == [0, 1, 0, 1, 0, 1]
    assert [r["pipeline/late_groups"] for r in loop_rows] == [0, 0, 4, 0, 4, 0]


async def test_a_regathered_batch_is_admission_checked_too(tmp_path):
    """The batch gathered again from the latest policy was trained without the staleness check: rollouts
    that always ask the base trained tokens max_steps_off_policy did not allow. Now the run stops, naming why."""
    from loop_helpers import ScriptedBackend

    model = gw.TrainableModel("stubborn", project="loop", base_model="none", base_path=str(tmp_path))
    backend = ScriptedBackend()
    await model.register(backend)
    with pytest.raises(gw.errors.GroupwiseError, match=r"step 2.*gathered again from policy 2.*late"):
        await gw.fit(model, _claiming(lambda v: 0), TRAIN[:4],
                     config=gw.LoopConfig(rollouts_per_group=2, groups_per_step=4, max_steps=6, patience=100,
                                          num_epochs=6, max_steps_off_policy=1))
    assert backend.step_of(model) == 2  # nothing past the first batch it could not admit was trained
