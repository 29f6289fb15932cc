"""ART's small helpers at ART's paths, which its notebooks import: `art.utils.strip_logprobs`,
`art.utils.logging`, `art.utils.output_dirs`, `art.backend.Backend`, `art.mcp.generate_scenarios.preview_scenarios`,
and `art.serverless`'s `ServerlessBackend` (a LocalBackend here) with its `train` result and `delete`,
and a second `ServerlessBackend()` that evaluates the model the first one trains."""

from __future__ import annotations

import re

import pytest
from openai.types.chat import ChatCompletionMessage, ChatCompletionTokenLogprob
from openai.types.chat.chat_completion import Choice, ChoiceLogprobs

import groupwise as art
from groupwise.errors import ArtCompatWarning, GroupwiseError


def _choice() -> Choice:
    entry = ChatCompletionTokenLogprob(token="hi", logprob=-0.5, bytes=[104, 105], top_logprobs=[])
    return Choice(index=0, finish_reason="stop", message=ChatCompletionMessage(role="assistant", content="hi"),
                  logprobs=ChoiceLogprobs(content=[entry]))


def test_strip_logprobs_copies_without_any_logprobs():
    from groupwise.utils.strip_logprobs import strip_logprobs

    choice = _choice()
    traced = {"messages": [{"role": "user", "content": "x"}, choice],
              "raw": ({"logprobs": [1, 2], "text": "t"},)}
    out = strip_logprobs(traced)
    assert out["messages"][1].logprobs is None and out["messages"][1].message.content == "hi"
    assert out["raw"] == ({"text": "t"},) and out["messages"][0] == {"role": "user", "content": "x"}
    assert choice.logprobs is not None and traced["raw"][0]["logprobs"] == [1, 2]  # the input is untouched

    class Uncopyable:
        def __deepcopy__(self, memo):
            raise TypeError("no")

    thing = Uncopyable()
    assert strip_logprobs(thing) is thing  # a tracer's hook must not fail the rollout
    # the list form groupwise's own client gets: the logprobs go, the sampled ids and texts stay
    compact = Choice.model_validate({"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": "hi"},
                                     "logprobs": None, "token_ids": [5], "token_logprobs": [-0.5], "token_texts": ["hi"]})
    out = strip_logprobs({"choice": compact})["choice"]
    assert "token_logprobs" not in out.model_extra and out.model_extra["token_ids"] == [5]
    assert compact.model_extra["token_logprobs"] == [-0.5]  # the input is untouched


def test_the_logging_helpers_print_one_labelled_line(capsys):
    from groupwise.utils import logging as art_logging

    for name in ("info", "step", "ok", "warn", "err"):
        getattr(art_logging, name)(f"{name} message")
    art_logging.dim("quiet")
    lines = capsys.readouterr().out.splitlines()
    assert [re.sub(r"^\[\d\d:\d\d:\d\d\] ", "", line) for line in lines] == [
        "INFO  info message", "STEP  step message", "OK    ok message", "WARN  warn message", "ERR   err message",
        "quiet"]  # no colour codes: stdout is no terminal here


def test_preview_scenarios_prints_the_first_tasks(capsys):
    from groupwise.mcp.generate_scenarios import preview_scenarios
    from groupwise.mcp.types import GeneratedScenario

    preview_scenarios([{"task": "Find the price of AAPL.", "difficulty": 2}, {"task": "x" * 130},
                       GeneratedScenario(task="Third", difficulty=5)], n=2)
    assert capsys.readouterr().out.splitlines() == [
        "   1. Find the price of AAPL.  (difficulty 2/5)", f"   2. {'x' * 120}…  (difficulty N/A/5)"]


async def test_serverless_backend_trains_here_and_deletes_the_run(tiny_model_dir, tmp_path):
    from groupwise.serverless.backend import ServerlessBackend as AtArtsPath

    assert art.ServerlessBackend is AtArtsPath is art.serverless.ServerlessBackend
    with pytest.warns(ArtCompatWarning, match=r"no hosted training service.*\(api_key ignored\)"):
        backend = art.ServerlessBackend(api_key="wandb-key")
    model = art.TrainableModel(name="agent", project="p", base_model=tiny_model_dir, base_path=str(tmp_path))
    await model.register(backend)
    try:
        client = model.openai_client()
        groups = []
        for g in range(2):
            trajectories = []
            for i in range(2):
                messages = [{"role": "user", "content": f"task {g}"}]
                r = await client.chat.completions.create(model=model.name, messages=messages, max_tokens=3, seed=i)
                trajectories.append(art.Trajectory(messages_and_choices=[*messages, r.choices[0]], reward=float(i)))
            groups.append(art.TrajectoryGroup(trajectories))
        result = await backend.train(model, groups, learning_rate=1e-4)
        assert isinstance(result, art.ServerlessTrainResult)
        assert (result.step, result.artifact_name) == (1, None) and result.checkpoint_path.endswith("0001")
        run_dir = model.store.run_dir
        assert (run_dir / "checkpoints" / "0001").is_dir()
        await backend.delete(model)
        assert not run_dir.exists()
        with pytest.raises(GroupwiseError, match="not registered"):
            await model.get_step()
    finally:
        await backend.close()


async def _one_step(model, backend, rewards=(0.0, 1.0)):
    client = model.openai_client()
    trajectories = []
    for i, reward in enumerate(rewards):
        messages = [{"role": "user", "content": "guess"}]
        r = await client.chat.completions.create(model=model.get_inference_name(), messages=messages,
                                                 max_tokens=3, seed=i)
        trajectories.append(art.Trajectory(messages_and_choices=[*messages, r.choices[0]], reward=reward))
    return await backend.train(model, [art.TrajectoryGroup(trajectories)], learning_rate=1e-4)


async def test_a_second_serverless_backend_evaluates_the_model_the_first_trains(tiny_model_dir, tmp_path):
    """A public program (a 20-questions agent, W&B serverless) trains with one `ServerlessBackend()` and,
    every few steps, evaluates in a helper that builds a new `TrainableModel` of the same name and
    registers it with a new `ServerlessBackend()`; in ART both talk to the one hosted service. Here the
    second registration found the run held by the first backend (RunLockedError); now the second
    construction is the same backend, which sees the trained step and trains on after the evaluation."""
    path = str(tmp_path / "art")
    with pytest.warns(ArtCompatWarning):
        backend = art.ServerlessBackend(path=path)
    model = art.TrainableModel(name="20q", project="p", base_model=tiny_model_dir)
    await model.register(backend)
    try:
        assert (await _one_step(model, backend)).step == 1
        with pytest.warns(ArtCompatWarning):
            eval_backend = art.ServerlessBackend(path=path)
        eval_model = art.TrainableModel(name="20q", project="p", base_model=tiny_model_dir)
        await eval_model.register(eval_backend)
        assert eval_backend is backend and await eval_model.get_step() == 1
        r = await eval_model.openai_client().chat.completions.create(
            model=eval_model.get_inference_name(), messages=[{"role": "user", "content": "guess"}], max_tokens=3)
        assert r.choices[0].message.content is not None
        with pytest.warns(ArtCompatWarning):
            elsewhere = art.ServerlessBackend(path=str(tmp_path / "other"))  # other arguments: another backend
        assert elsewhere is not backend
        await elsewhere.close()
        await eval_backend.close()  # one client leaves; the service stays open for the other
        assert (await _one_step(model, backend)).step == 2
    finally:
        await backend.close()
    with pytest.raises(GroupwiseError, match="not registered"):  # the last client closed the service
        await model.get_step()
    with pytest.warns(ArtCompatWarning):
        assert art.ServerlessBackend(path=path) is not backend


def test_output_dirs_name_the_folders_a_run_writes(tmp_path, monkeypatch):
    """ART's path helpers (third-party trainers import them at the top) give the folders groupwise's
    run store writes: the run, its step checkpoints, its trajectories by split; by default under the
    backend's default folder in the working directory."""
    from groupwise.backend import Backend
    from groupwise.runs.store import RunStore
    from groupwise.utils import output_dirs as od

    assert Backend is art.Backend
    store = RunStore(tmp_path, "proj", "run1")
    model = art.TrainableModel(name="run1", project="proj", base_model="smollm2-135m")
    run_dir = od.get_model_dir(model, str(tmp_path))
    assert run_dir == od.get_output_dir_from_model_properties("proj", "run1", str(tmp_path)) == str(store.run_dir)
    assert od.get_step_checkpoint_dir(run_dir, 7) == str(store.checkpoints_dir / "0007")
    assert od.get_trajectories_split_dir(run_dir, "val") == str(store.trajectories_path("val", 3).parent)
    assert od.get_trajectories_dir(run_dir) == str(store.run_dir / "trajectories")
    assert od.get_models_dir("proj", str(tmp_path)) == str(tmp_path / "proj" / "models")
    monkeypatch.chdir(tmp_path)
    assert od.get_model_dir(model) == str(tmp_path / art.LocalBackend().path / "proj" / "models" / "run1")
    elsewhere = art.TrainableModel(name="run2", project="proj", base_model="smollm2-135m", base_path="runs")
    assert od.get_model_dir(elsewhere) == str(tmp_path / "runs" / "proj" / "models" / "run2") == str(elsewhere.store.run_dir.resolve())


def test_a_model_used_before_register_raises_valueerror_as_in_art():
    """ART raises ValueError for a trainable model's client before `register`; a ported
    ``except ValueError`` keeps catching it (a GroupwiseError too)."""
    from groupwise.errors import NotRegisteredError

    model = art.TrainableModel(name="early", project="proj", base_model="smollm2-135m")
    for use in (model.openai_client, lambda: model.backend):
        with pytest.raises(ValueError, match="await model.register") as caught:
            use()
        assert isinstance(caught.value, NotRegisteredError) and isinstance(caught.value, GroupwiseError)


def test_format_message_prints_the_role_content_and_tool_calls():
    from groupwise.utils import format_message
    from groupwise.utils.format_message import format_message as at_arts_path

    assert format_message is at_arts_path
    assert format_message({"role": "user", "content": "Move left."}) == "User:\nMove left."
    call = {"id": "c1", "type": "function", "function": {"name": "move", "arguments": '{"to": "left"}'}}
    assert format_message({"role": "assistant", "content": "Sure.", "tool_calls": [call, call]}) == (
        'Assistant:\nSure.\nmove({"to": "left"})\nmove({"to": "left"})')
    assert format_message({"role": "assistant", "content": None, "tool_calls": [call]}) == 'Assistant:\nmove({"to": "left"})'
    assert format_message({"role": "assistant", "refusal": "No."}) == "Assistant:\nNo."


def test_get_model_step_reads_the_latest_checkpoint_of_the_run_folder(tmp_path):
    from groupwise.utils import get_model_step
    from groupwise.utils.get_model_step import get_step_from_dir

    model = art.TrainableModel(name="agent", project="p", base_model="x", base_path=str(tmp_path))
    assert get_model_step(model) == 0  # nothing trained yet
    for step in ("0001", "0012", "0003"):
        (model.store.run_dir / "checkpoints" / step).mkdir(parents=True)
    (model.store.run_dir / "checkpoints" / "0099.tmp").mkdir()  # a checkpoint being written is no step
    assert get_model_step(model) == 12 == get_step_from_dir(str(model.store.run_dir))
    assert get_model_step(model, str(tmp_path / "elsewhere")) == 0


async def test_log_http_errors_says_what_the_server_answered():
    import httpx

    from groupwise.utils import log_http_errors

    def answer(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/fastapi":
            return httpx.Response(422, json={"detail": "bad field"})
        if request.url.path == "/openai":
            return httpx.Response(404, json={"error": {"message": "no such model"}})
        return httpx.Response(500, text="<html>oops</html>")

    @log_http_errors
    async def get(path: str) -> httpx.Response:
        async with httpx.AsyncClient(transport=httpx.MockTransport(answer), base_url="http://server") as http:
            return (await http.get(path)).raise_for_status()

    with pytest.raises(GroupwiseError, match=r"^\[HTTP 422\] http://server/fastapi bad field$"):
        await get("/fastapi")
    with pytest.raises(GroupwiseError, match=r"^\[HTTP 404\] http://server/openai no such model$"):
        await get("/openai")
    with pytest.raises(httpx.HTTPStatusError):  # not JSON: the original error
        await get("/html")


def test_messages_write_no_content_as_an_empty_string_as_art_does():
    # ART 0.4+'s messages(): content None becomes "" (programs call str methods on it); a Choice that only
    # calls a tool is an assistant message with content "" and its tool calls
    from openai.types.chat import ChatCompletionMessageToolCall
    from openai.types.chat.chat_completion_message_tool_call import Function

    from groupwise.trajectories import get_messages

    call = ChatCompletionMessageToolCall(id="c1", type="function", function=Function(name="f", arguments="{}"))
    choice = Choice(index=0, finish_reason="tool_calls",
                    message=ChatCompletionMessage(role="assistant", content=None, tool_calls=[call]))
    items = [{"role": "user", "content": "x"}, choice, {"role": "tool", "tool_call_id": "c1", "content": None}]
    trajectory = art.Trajectory(messages_and_choices=items)
    messages = trajectory.messages()
    assert [m["content"] for m in messages] == ["x", "", ""]
    assert messages[1]["tool_calls"][0]["function"]["name"] == "f"
    assert items[2]["content"] is None  # the trajectory's own messages are not changed
    assert get_messages(items) == messages
