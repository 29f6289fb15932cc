"""Built-in environments, and the registry `groupwise train <env>` reads.

Layout: each env is a folder with pure rules (``game.py``, ``problems.py``, ``inbox.py``; no I/O, no
LLM) apart from the agent glue in ``env.py`` (prompt, reply parsing, reward, ``async def rollout``).
Every rollout talks to the model only through ``model.openai_client()`` (see `_chat.complete`), so the
same code runs against groupwise's local engine, vLLM or a hosted API.

`ENVS` maps a name to an `EnvSpec`: the env's contract, what the loop needs to train on it (rollout,
scenario splits, validation metric, reward kind, judge rubric, a scripted demonstrator). How much to train
on it (steps, group sizes, learning rate) is a job's setting, not the env's: `groupwise train` keeps a
preset per env (``groupwise.jobs.train.PRESETS``). ``gw.fit`` consumes a spec::

    spec = get_env("2048")
    train, val, test = spec.scenarios(seed)
    gw.fit(model, spec.rollout, train, val_scenarios=val, validate=spec.validate, ...)

This module imports no torch (only pydantic and the stdlib, through the env modules).
"""

from __future__ import annotations

import dataclasses

from groupwise.envs import email_search, game_2048, math, oneword, tictactoe, titles
from groupwise.envs.openenv_hub import from_openenv
from groupwise.envs.spec import EnvSpec, RewardKind
from groupwise.envs.verifiers_hub import from_verifiers, load_verifiers_environment
from groupwise.errors import UnknownKeyError

_TICTACTOE = EnvSpec(
    name="tictactoe",
    description="Tic-tac-toe as X against a random opponent: reply <move>N</move> with a free cell.",
    rollout=tictactoe.rollout,
    scenarios=tictactoe.scenarios,
    validate=tictactoe.validate,
    val_metric="win_rate",
    reward="verifiable",
    demonstrate=tictactoe.demonstration,
)

ENVS: dict[str, EnvSpec] = {
    "2048": EnvSpec(
        name="2048",
        description="2048, short games: answer each board with one legal <move>dir</move>.",
        rollout=game_2048.rollout,
        scenarios=game_2048.scenarios,
        validate=game_2048.validate,
        val_metric="valid_move_rate",
        reward="verifiable",
    ),
    "tictactoe": _TICTACTOE,
    # The same agent; only the opponent, and so what counts as success, differ.
    "tictactoe-minimax": dataclasses.replace(
        _TICTACTOE,
        name="tictactoe-minimax",
        description="Tic-tac-toe as X against minimax (perfect play): the best result is a draw.",
        scenarios=tictactoe.scenarios_minimax,
        validate=tictactoe.validate_not_lost,
        val_metric="not_lost_rate",
    ),
    "math": EnvSpec(
        name="math",
        description="Level-1 arithmetic and word problems, graded by the exact final answer.",
        rollout=math.rollout,
        scenarios=math.scenarios,
        validate=math.validate,
        val_metric="accuracy",
        reward="verifiable",
    ),
    "oneword": EnvSpec(
        name="oneword",
        description="Answer a short question with exactly one word; graded by the reply's form alone.",
        rollout=oneword.rollout,
        scenarios=oneword.scenarios,
        validate=oneword.validate,
        val_metric="one_word_rate",
        reward="verifiable",
    ),
    "email": EnvSpec(
        name="email",
        description="Answer questions about a synthetic inbox with search/read tools (ART-E-like).",
        rollout=email_search.rollout,
        scenarios=email_search.scenarios,
        validate=email_search.validate,
        val_metric="accuracy",
        reward="hybrid",
        rubric=(
            "The agent answers a question about the user's inbox with search and read tools. Prefer the "
            "trajectory whose final answer is correct and cites the email it came from; then one that "
            "says it does not know over one that guesses; among equals, fewer and well-formed tool calls."
        ),
        gate_metric="correct",
        demonstrate=email_search.demonstration,
    ),
    "titles": EnvSpec(
        name="titles",
        description="Write an engaging title for a short text; judged by RULER only.",
        rollout=titles.rollout,
        scenarios=titles.scenarios,
        validate=titles.validate,
        val_metric=None,
        reward="judge",
        rubric=titles.RUBRIC,
    ),
}


# An env from a hub, by name: ``verifiers:<module or installed env id>`` (`verifiers_hub`).
HUB_PREFIXES = ("verifiers:",)


def get_env(name: str) -> EnvSpec:
    """The EnvSpec called `name`: a built-in env, or ``verifiers:<module>`` (the verifiers environment that
    module's ``load_environment()`` returns); a KeyError that lists the known names otherwise."""
    if name.startswith("verifiers:") and name.partition(":")[2]:
        module = name.partition(":")[2]
        # the spec's name names the runs' folders: no colon in it
        return from_verifiers(load_verifiers_environment(module), name=f"verifiers-{module}")
    try:
        return ENVS[name]
    except KeyError:
        raise UnknownKeyError(f"no environment {name!r}; the built-in ones are {sorted(ENVS)}, or "
                              "verifiers:<module> for a verifiers environment") from None


__all__ = ["ENVS", "HUB_PREFIXES", "EnvSpec", "RewardKind", "from_openenv", "from_verifiers", "get_env",
           "load_verifiers_environment"]
