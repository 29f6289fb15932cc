"""verifiers environments (Prime Intellect's environments hub) as an `EnvSpec` for `gw.fit`.

``gw.envs.from_verifiers(env)`` takes a verifiers ``Environment`` (``SingleTurnEnv``, ``MultiTurnEnv``,
``ToolEnv``, ...; what ``vf.load_environment("name")`` returns) and gives the loop what it needs:

- scenarios: the env's dataset rows (``prompt`` with its system prompt and few-shot already formatted by
  the env, ``answer``, ``task``, ``info``), one `VerifiersScenario` each; validation and test rows come
  from the env's eval dataset when it has one, else from the end of its dataset.
- a rollout that runs the env's own ``rollout`` (its protocol: turns, ``env_response``, stop conditions,
  tool calls) against ``model.openai_client()`` through verifiers' own OpenAI chat client, then scores it
  with the env's own rubric (``rubric.score_rollout``): the rubric's weighted reward is the trajectory's
  reward and every reward function's score one of its metrics. The behaviour is theirs; groupwise only
  records each `Choice` as the server returned it (token ids and logprobs, what GRPO trains on), so the
  trajectory is the conversation the env ran with the model's sampled turns in it.
- a ``JudgeRubric``'s judge pointed at a judge groupwise resolves (``judge="local/..."`` or a provider
  name, `groupwise.judge.providers`), so an env written for a hosted judge runs against a served one.

The classic API (verifiers 0.2 and 0.3: ``verifiers.envs`` and ``verifiers.legacy``) is the one
environments on the hub are written in; verifiers 0.4 ships only its ``v1`` task/harness stack, which
`verifiers_v1` drives (``from_verifiers`` hands a v1 ``Env`` or ``Taskset`` to it).
"""

from __future__ import annotations

import copy
import importlib
import random
from collections.abc import Sequence
from typing import Any

from pydantic import Field

from groupwise.core.choices import wants_compact_token_data
from groupwise.core.trajectory import Trajectory
from groupwise.envs.spec import EnvSpec
from groupwise.envs._chat import TURN_SEED_STRIDE, Sampling, conversations, inference_name, number_or_none
from groupwise.errors import ArgumentTypeError, EnvError, MissingDependencyError

SUPPORTED = ("verifiers>=0.2,<0.5: the classic API of 0.2 and 0.3 (SingleTurnEnv, MultiTurnEnv, ToolEnv and their "
             "subclasses) and the verifiers.v1 stack of 0.4 (a vf.Taskset, or a vf.Env whose agents run in the "
             "local subprocess runtime)")


class VerifiersScenario(Sampling):
    """One row of a verifiers env's dataset, with the sampling settings of its rollout."""

    row: dict[str, Any] = Field(description="The dataset row as the env formatted it (prompt, answer, task, info).")
    split: str = Field("train", description="Which split the row came from (train, val or test).")


def _import_verifiers() -> Any:
    try:
        return importlib.import_module("verifiers")
    except ImportError as exc:
        if getattr(exc, "name", None) in ("verifiers", None):
            raise MissingDependencyError("gw.envs.from_verifiers", "verifiers", "verifiers") from exc
        raise


def load_verifiers_environment(name: str, **env_args: Any) -> Any:
    """The verifiers environment called `name`: an installed env package (``vf-install``, ``prime env
    install``) through ``vf.load_environment``, else a module on the path with ``load_environment()``."""
    vf = _import_verifiers()
    module_name = name.replace("-", "_")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name != module_name:
            raise
        if not hasattr(vf, "load_environment"):
            raise ArgumentTypeError(f"no module {module_name!r} on the path, and verifiers "
                                    f"{getattr(vf, '__version__', '?')} has no load_environment: {SUPPORTED}")
        return vf.load_environment(name, **env_args)
    load = getattr(module, "load_environment", None)
    if not callable(load):
        from groupwise.envs import verifiers_v1

        if verifiers_v1.v1_taskset_module(module):  # a verifiers 0.4 taskset plugin: it exports its Taskset
            return verifiers_v1.environment(module_name, **env_args)
        raise EnvError(f"module {module_name!r} has no load_environment() and exports no verifiers.v1 Taskset: a "
                       "verifiers environment module defines `def load_environment(**kwargs) -> vf.Environment` "
                       "(verifiers 0.2/0.3), or exports its `vf.Taskset` subclass in `__all__` (verifiers 0.4).")
    return load(**env_args)


def _rows(dataset: Any) -> list[dict[str, Any]]:
    return [dict(row) for row in dataset] if dataset is not None else []


def _dataset(env: Any, getter: str) -> Any:
    get = getattr(env, getter, None)
    try:
        return get() if callable(get) else None
    except ValueError:  # verifiers raises when the env was built without that split
        return None


def _judge_rubrics(rubric: Any) -> list[Any]:
    """Every JudgeRubric in `rubric` (a RubricGroup holds several rubrics)."""
    found = [rubric] if hasattr(rubric, "judge_client") and hasattr(rubric, "judge_model") else []
    for child in getattr(rubric, "rubrics", None) or []:
        found.extend(_judge_rubrics(child))
    return found


def point_judges(env: Any, judge: str, *, client: Any = None) -> int:
    """Point every JudgeRubric of `env` at `judge` (a name `groupwise.judge.providers.resolve` takes:
    ``"openai/gpt-4.1-mini"``, ``"local/<model>"``, or any name with `client`); returns how many."""
    from groupwise.judge.providers import resolve

    rubrics = _judge_rubrics(env.rubric)
    if not rubrics:
        raise EnvError(f"judge={judge!r} was given, but the env's rubric has no JudgeRubric to point at it")
    endpoint = resolve(judge, client=client)
    for rubric in rubrics:
        rubric.judge_client, rubric.judge_model = endpoint.client, endpoint.model
        objects = getattr(rubric, "class_objects", None)
        if isinstance(objects, dict):  # what the rubric hands its reward functions as judge_client=...
            objects.update(judge_client=endpoint.client, judge_model=endpoint.model)
    return len(rubrics)


def _recording_client(vf: Any, openai_client: Any, calls: list[tuple[list[Any], Any, Any]]) -> Any:
    """verifiers' own OpenAI chat client over `openai_client`, keeping each request's messages and tools and
    the `Choice` it returned: verifiers turns a response into its own message type, which drops the token
    ids and logprobs groupwise's server attaches to the Choice."""

    class RecordingClient(vf.OpenAIChatCompletionsClient):
        async def get_native_response(self, prompt: Any, model: str, sampling_args: Any, tools: Any = None,
                                      **kwargs: Any) -> Any:
            if sampling_args and sampling_args.get("seed") is not None and calls:
                sampling_args = {**sampling_args, "seed": sampling_args["seed"] + TURN_SEED_STRIDE * len(calls)}
            response = await super().get_native_response(prompt, model, sampling_args, tools, **kwargs)
            if response.choices:
                calls.append((copy.deepcopy(list(prompt)), tools, response.choices[0]))
            return response

    return RecordingClient(openai_client)


def _policy_error(vf: Any, error: Any) -> bool:
    """Whether the error that ended a verifiers rollout is the policy's own output: an empty or invalid
    reply (verifiers' ``ModelError``s) or a tool call it cannot parse (``ToolParseError``). verifiers
    scores such a rollout with its rubric, as its own ``run_rollout`` does, and so does groupwise: the
    sampled reply is in the trajectory, so GRPO discourages it. Raising would drop exactly the replies
    the policy should unlearn (and a run that samples a few empty replies would end). Any other error
    (a tool that failed, a sandbox, the infrastructure) is the env's, and raises."""
    kinds = tuple(k for k in (getattr(vf, "ModelError", None), getattr(vf, "ToolParseError", None)) if k)
    return bool(kinds) and isinstance(error, kinds)


def make_rollout(env: Any, *, sampling_args: dict[str, Any] | None = None) -> Any:
    """``async rollout(model, scenario) -> Trajectory`` running `env`'s protocol and rubric (module doc)."""
    vf = _import_verifiers()
    extra = {k: v for k, v in (getattr(env, "sampling_args", None) or {}).items() if k != "n" and v not in ({}, None)}
    extra.update(sampling_args or {})

    async def rollout(model: Any, scenario: VerifiersScenario) -> Trajectory:
        if not isinstance(scenario, VerifiersScenario):
            raise ArgumentTypeError(f"a verifiers rollout takes a VerifiersScenario (from spec.scenarios), got "
                                    f"{type(scenario).__name__}")
        client = model.openai_client()
        args: dict[str, Any] = {**extra, "max_tokens": scenario.max_tokens, "temperature": scenario.temperature}
        if scenario.logprobs and not wants_compact_token_data(getattr(client, "default_headers", None) or {}):
            args["logprobs"] = True
        if scenario.sampling_seed is not None:
            args["seed"] = scenario.sampling_seed
        calls: list[tuple[list[Any], Any, Any]] = []
        state = await env.rollout(copy.deepcopy(scenario.row), _recording_client(vf, client, calls),
                                  inference_name(model), args)
        error = state.get("error")
        policy_error = _policy_error(vf, error)
        if error is not None and not policy_error:  # training on an env's failure would hide it
            raise EnvError(f"the verifiers env's rollout failed: {error!r}") from (
                error if isinstance(error, BaseException) else None)
        await env.rubric.score_rollout(state)
        await env.rubric.cleanup(state)
        if not calls:
            raise EnvError("the verifiers env ended its rollout without asking the model anything; nothing to train")
        first, *more = conversations(calls)
        metrics: dict[str, float] = {}
        for name, value in (state.get("metrics") or {}).items():
            number = number_or_none(value)
            if number is not None:
                metrics[name] = number
        metrics["turns"] = float(len(calls))
        metrics["model_error"] = float(policy_error)
        metrics["truncated"] = float(bool(state.get("is_truncated") or state.get("timed_out")))
        reward = number_or_none(state.get("reward"))
        return Trajectory(messages_and_choices=first.messages_and_choices, tools=first.tools,
                          additional_histories=more, reward=reward if reward is not None else 0.0, metrics=metrics,
                          metadata={"stop_condition": str(state.get("stop_condition") or ""),
                                    **({"error": repr(error)} if policy_error else {})})

    return rollout


def from_verifiers(
    env: Any,
    *,
    judge: str | None = None,
    judge_client: Any = None,
    name: str | None = None,
    max_tokens: int | None = None,
    val_size: int = 32,
    test_size: int = 32,
    sampling_args: dict[str, Any] | None = None,
    num_tasks: int | None = None,
) -> Any:
    """An `EnvSpec` for a verifiers environment (module doc).

    Args:
        env: a verifiers ``Environment`` (``vf.load_environment(...)``, ``vf.SingleTurnEnv(...)``, ...), or
            of verifiers 0.4's v1 stack a ``vf.Taskset`` (class or instance) or a ``vf.Env`` (`verifiers_v1`).
        judge: point every ``JudgeRubric`` of the env at this judge (``"local/<model>"``, a provider's
            ``"openai/gpt-4.1-mini"``, or any name with `judge_client`); None keeps the env's own judge.
        judge_client: an ``openai.AsyncOpenAI`` for `judge` (e.g. ``LocalBackend.judge_client(...)``).
        name: the spec's name (default ``verifiers:<env_id or class name>``).
        max_tokens: the most tokens per model turn (default: the env's ``sampling_args``' max_tokens, else 256).
        val_size, test_size: how many validation and test rows (from the eval dataset when the env has one).
        sampling_args: more request settings for every model turn (the env's own ``sampling_args`` first).
        num_tasks: a v1 taskset's first N tasks (needed for an infinite one); classic envs use all rows.
    """
    from groupwise.envs import verifiers_v1

    if verifiers_v1.is_v1(env):
        return verifiers_v1.from_v1(env, name=name, max_tokens=max_tokens, val_size=val_size, test_size=test_size,
                                    sampling_args=sampling_args, judge=judge, num_tasks=num_tasks)
    if num_tasks is not None:
        raise ArgumentTypeError("num_tasks= takes the first N tasks of a verifiers v1 taskset; a classic env's rows "
                                "are its dataset's (pass a smaller dataset)")
    vf = _import_verifiers()
    if not hasattr(env, "rollout") or not hasattr(env, "rubric") or not hasattr(vf, "OpenAIChatCompletionsClient"):
        raise ArgumentTypeError(f"gw.envs.from_verifiers takes a verifiers Environment of {SUPPORTED}; got "
                                f"{type(env).__name__} with verifiers {getattr(vf, '__version__', '?')}")
    rubric = env.rubric
    group_rewards = getattr(rubric, "has_group_rewards", False)  # a property in some releases, a method in others
    if group_rewards() if callable(group_rewards) else group_rewards:
        raise EnvError("this verifiers env's rubric has group-level reward functions (they score a whole group "
                       "at once); gw.envs.from_verifiers scores each rollout with rubric.score_rollout, which "
                       "verifiers refuses for them. Use per-rollout reward functions.")
    if judge is not None:
        point_judges(env, judge, client=judge_client)
    tokens = max_tokens or (getattr(env, "sampling_args", None) or {}).get("max_tokens") or 256
    train_rows = _rows(_dataset(env, "get_dataset"))
    # get_eval_dataset() falls back to the training rows when the env has no eval dataset: ask for it only
    # when the env was given one, so validation never scores rows it trains on
    has_eval = getattr(env, "eval_dataset_source", None) is not None or getattr(env, "eval_dataset", None) is not None
    eval_rows = _rows(_dataset(env, "get_eval_dataset")) if has_eval else []
    if not train_rows and not eval_rows:
        raise EnvError("the verifiers env has neither a dataset nor an eval dataset: nothing to train on")
    if not eval_rows:  # held out from the end of the dataset, never trained on
        held = min(val_size + test_size, len(train_rows) // 2)
        train_rows, eval_rows = train_rows[: len(train_rows) - held], train_rows[len(train_rows) - held:]
    elif not train_rows:
        raise EnvError("the verifiers env has only an eval dataset; training needs its dataset")
    # a small held-out set is shared between validation and test rather than leaving test empty
    n_val = min(val_size, len(eval_rows) - min(test_size, len(eval_rows) // 2))
    val_rows, test_rows = eval_rows[:n_val], eval_rows[n_val: n_val + test_size]

    def scenarios(seed: int, **overrides: Any) -> tuple[list[Any], list[Any], list[Any]]:
        def make(rows: Sequence[dict[str, Any]], split: str) -> list[VerifiersScenario]:
            settings = {"max_tokens": tokens, **overrides}
            return [VerifiersScenario(row=row, split=split, **settings) for row in rows]

        train = make(train_rows, "train")
        random.Random(f"verifiers:{seed}").shuffle(train)
        return train, make(val_rows, "val"), make(test_rows, "test")

    env_id = getattr(env, "env_id", None) or type(env).__name__
    return EnvSpec(
        name=name or f"verifiers:{env_id}",
        description=f"verifiers environment {env_id} ({type(env).__name__}), rewarded by its rubric",
        rollout=make_rollout(env, sampling_args=sampling_args),
        scenarios=scenarios,
        validate=lambda trajectory: trajectory.reward,
        val_metric="rubric_reward",  # the validation rows' mean rubric reward ("reward" names a history field)
        reward="verifiable",
    )


__all__ = ["SUPPORTED", "VerifiersScenario", "from_verifiers", "load_verifiers_environment", "make_rollout",
           "point_judges"]
