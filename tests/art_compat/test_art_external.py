"""ART's example programs that reach external services (a Hugging Face hub data set, a reward model
served on Modal, ...), run as ART wrote them (art_repo/, OpenPipe/ART at art_runner.ART_COMMIT) with
only the import changed, against local stand-ins of those services with the same interface (see
art_runner's seams), each through at least one training step on the tiny random model.
"""

from __future__ import annotations

import asyncio
from datetime import datetime

import pytest

import groupwise as gw
from art_runner import Program, run_program

HN_STORIES = "OpenPipe/hacker-news-scraped-stories-filtered"


def hn_story(i: int, split: str) -> dict:
    """A row of ART's Hacker News data set, in its columns and types (`time` is a datetime)."""
    return {"id": i, "title": f"Show HN: a tiny thing number {i}", "by": f"user{i}", "score": 20 + i,
            "time": datetime(2024, 5, 1 + i, 12, 0), "url": f"https://example.com/{i}", "split": split,
            "scraped_body": f"We built a tiny thing, number {i}. It parses logs and draws a chart."}


class TitleRewardModel:
    """The stand-in for ART's reward model on Modal (POST a story as `ScoreRequest` -> {"score": x}):
    a title scores by how close its length is to eight words. It keeps the stories it was asked about,
    so the test sees that the program's own scoring path ran."""

    def __init__(self) -> None:
        self.requests: list[dict] = []

    def __call__(self, story: dict) -> dict:
        self.requests.append(story)
        return {"score": 1.0 / (1.0 + abs(len(story["title"].split()) - 8))}


def test_hn_title_generator(art_model_dir, tmp_path, backup_bucket):
    reward_model = TitleRewardModel()
    program = Program(
        "examples/hn_title_generator/train.py", helpers=("examples/hn_title_generator/utils.py",),
        shrink={"examples/hn_title_generator/train.py": [
            ("TRAINING_DATASET_SIZE = 5000", "TRAINING_DATASET_SIZE = 1", 1),
            ("VAL_SET_SIZE = 100", "VAL_SET_SIZE = 1", 1), ("NUM_GENERATIONS = 6", "NUM_GENERATIONS = 2", 1)]},
        base_models=("Qwen/Qwen2.5-7B-Instruct",),
        hub={(HN_STORIES, "train"): [hn_story(i, "train") for i in range(2)],
             (HN_STORIES, "val"): [hn_story(i, "val") for i in range(2, 4)]},
        services={"REWARD_MODEL_URL": reward_model},
    )
    run_program(program, tmp_path, art_model_dir)

    # every generated title went to the reward model as ART's ScoreRequest, with the story's fields
    assert len(reward_model.requests) == 2
    assert {tuple(sorted(r)) for r in reward_model.requests} == {("by", "scraped_body", "time", "title", "url")}
    assert {r["by"] for r in reward_model.requests} == {"user0"}
    assert reward_model.requests[0]["time"] == "2024-05-01T12:00:00"
    train = [r for r in gw.load_history(tmp_path / ".groupwise" / "hn_title_generation" / "models" / "001")
             if r["split"] == "train"]
    assert [r["step"] for r in train] == [0]
    # the program's own metrics, per trajectory: the reward model's score and the title's length
    assert {"rm", "length", "matches"} <= {k.split("/")[-1] for k in train[0]}, sorted(train[0])


ENRON_EMAILS = "corbt/enron-emails"
ENRON_QUESTIONS = "corbt/enron_emails_sample_questions"
INBOX = "jeff.dasovich@enron.com"


def enron_email(i: int) -> dict:
    """A row of ART's Enron email data set, in its columns and types (`date` a datetime)."""
    return {"message_id": f"<{1000 + i}.JavaMail.evans@thyme>", "subject": f"Gas contract {i}",
            "from": f"sender{i}@enron.com", "to": [INBOX], "cc": [], "bcc": [],
            "date": datetime(2001, 3, 1 + i, 9, 30), "body": f"The gas contract number {i} closes on Friday.",
            "file_name": f"dasovich-j/inbox/{i}."}


def enron_question(i: int) -> dict:
    return {"id": i, "question": f"When does gas contract {i} close?", "answer": "Friday",
            "message_ids": [enron_email(i)["message_id"]], "how_realistic": 0.9, "inbox_address": INBOX,
            "query_date": "2001-04-01"}


async def train_one_step(base_model: str, path, trajectories: list) -> dict:
    from groupwise.local import LocalBackend

    with LocalBackend(path=str(path)) as backend:
        model = gw.TrainableModel(name="retrain", project="email_agent", base_model=base_model)
        await model.register(backend)
        result = await backend.train(model, [gw.TrajectoryGroup(trajectories)], learning_rate=1e-3)
    return result.metrics


def test_art_e(art_model_dir, tmp_path, backup_bucket):
    """ART's email agent (ART-E): its own script builds the SQLite full-text email database from the
    hub data set, and its rollout samples through LiteLLM against the model's HTTP endpoint."""
    art_e = "examples/art-e/art_e/"
    program = Program(
        art_e + "train.py",
        helpers=tuple(art_e + f for f in (
            "__init__.py", "rollout.py", "project_types.py", "email_search_tools.py", "data/__init__.py",
            "data/local_email_db.py", "data/query_iterators.py", "data/types_enron.py", "evaluate/__init__.py",
            "evaluate/benchmark.py")),
        shrink={
            art_e + "train.py": [("max_turns=10", "max_turns=2", 1), ("trajectories_per_group=6", "trajectories_per_group=2", 1),
                                 ("groups_per_step=8", "groups_per_step=1", 1), ("val_set_size=100", "val_set_size=1", 1),
                                 ("training_dataset_size=4000", "training_dataset_size=1", 1)],
            art_e + "project_types.py": [("max_tokens: int = 2048", "max_tokens: int = 16", 1)],
            art_e + "evaluate/benchmark.py": [("limit: int = 100", "limit: int = 1", 1)],
        },
        package_roots=("examples/art-e",),
        base_models=("Qwen/Qwen2.5-14B-Instruct",),
        # RUN_ID picks the agent (train.py's __main__); LiteLLM reads its price list from its package
        # instead of fetching it from GitHub
        env={"RUN_ID": "002", "LITELLM_LOCAL_MODEL_COST_MAP": "True"},
        hub={(ENRON_EMAILS, "train"): [enron_email(i) for i in range(3)],
             (ENRON_QUESTIONS, "train"): [enron_question(0)], (ENRON_QUESTIONS, "test"): [enron_question(1)]},
    )
    run_program(program, tmp_path, art_model_dir)

    import sqlite3

    db = sqlite3.connect(tmp_path / "examples/art-e/data/enron_emails.db")
    assert db.execute("SELECT count(*) FROM emails").fetchone() == (3,)
    # the full-text index the agent's search tool queries was built by the program's own script
    assert db.execute("SELECT rowid FROM emails_fts WHERE emails_fts MATCH 'contract AND 2'").fetchall() == [(3,)]
    run = tmp_path / ".groupwise" / "email_agent" / "models" / "email-agent-002"
    rows = gw.load_history(run)
    assert [r["step"] for r in rows if r["split"] == "train"] == [0]
    # benchmark_model logged a validation row before the step (global_step 0 % eval_steps) and after it
    assert [r["step"] for r in rows if r["split"] == "val"] == [0, 1]
    # each rollout's turn, sampled through LiteLLM, is stored as the openai Choice that
    # art.utils.litellm.convert_litellm_choice_to_openai made of it
    trajectories = [t for group in gw.load_trajectories(run, step=0, split="train") for t in group]
    assert len(trajectories) == 2
    assert all(isinstance(t.messages_and_choices[2], gw.types.Choice) for t in trajectories)
    # LiteLLM 1.65 keeps a choice's logprobs but drops the server's `token_ids` field: the sampled ids
    # come back through the logprob entries, named "token_id:<id>" (the server's default, as ART's vLLM)
    for t in trajectories:
        choice = t.messages_and_choices[2]
        ids = gw.choices.choice_token_ids(choice)
        assert ids and [e.token for e in choice.logprobs.content] == [f"token_id:{i}" for i in ids]
    # The program's own step has no signal: a random model never writes a tool call, so every rollout
    # earns the same reward (bad_tool_call_args, -1.7). The same stored turns with distinct rewards
    # train on every sampled token, so a model that calls tools learns from ART-E's rollouts
    assert [t.reward for t in trajectories] == [-1.7, -1.7]
    sampled = sum(len(gw.choices.choice_token_ids(c)) for t in trajectories for c in t.choices())
    for i, t in enumerate(trajectories):
        t.reward = float(i)
    metrics = asyncio.run(train_one_step(art_model_dir, tmp_path / "retrain", trajectories))
    assert metrics["skipped"] == 0.0 and metrics["sequences"] == 2
    assert metrics["trainable_tokens"] + metrics["forced_tokens"] == sampled > 0
    # pushed to the backup bucket after training, as ART lays it out
    assert (backup_bucket / "email_agent" / "models" / "email-agent-002").is_dir()


def test_litellm_choice_keeps_the_sampled_token_ids():
    """convert_litellm_choice_to_openai (ART's art.utils.litellm) makes an openai Choice of a LiteLLM
    one: the message, its tool calls, and the token ids a LiteLLM that keeps unknown choice fields
    (`provider_specific_fields`) kept, so the turn trains on what was sampled."""
    from litellm.types.utils import ChatCompletionMessageToolCall, Choices, Function, Message

    from groupwise.utils.litellm import convert_litellm_choice_to_openai

    call = ChatCompletionMessageToolCall(id="c1", type="function",
                                         function=Function(name="read_email", arguments='{"message_id": "m"}'))
    litellm_choice = Choices(finish_reason="tool_calls", index=0,
                             message=Message(content=None, role="assistant", tool_calls=[call]),
                             provider_specific_fields={"token_ids": [5, 6, 7], "forced_token_indices": [1]})
    choice = convert_litellm_choice_to_openai(litellm_choice)
    assert isinstance(choice, gw.types.Choice)
    assert choice.message.tool_calls[0].function.name == "read_email"
    assert choice.message.tool_calls[0].function.arguments == '{"message_id": "m"}'
    assert (choice.finish_reason, gw.choices.choice_token_ids(choice), gw.choices.choice_forced_indices(choice)) == (
        "tool_calls", [5, 6, 7], [1])
    plain = convert_litellm_choice_to_openai(Choices(finish_reason="stop", index=0,
                                                     message=Message(content="hi", role="assistant")))
    assert (plain.message.content, gw.choices.choice_token_ids(plain)) == ("hi", None)


PIPELINE = "src/art/pipeline_trainer/"  # ART 0.5.18's pipeline examples: modules of ART's package


def test_pipeline_trainer_yes_no_maybe(yes_no_maybe_model_dir, tmp_path):
    # ART's PipelineTrainer example, run as `python -m art.pipeline_trainer.yes_no_maybe_pipeline` runs
    # it (its `from . import PipelineTrainer` reaches groupwise.pipeline_trainer); Tinker's hosted backend
    # (an external service) is a LocalBackend here; the base model answers yes, no or maybe at random
    program = Program(
        PIPELINE + "yes_no_maybe_pipeline.py",
        shrink={PIPELINE + "yes_no_maybe_pipeline.py": [
            ("ROLLOUTS_PER_SCENARIO = 32", "ROLLOUTS_PER_SCENARIO = 4", 1), ("MAX_STEPS = 20", "MAX_STEPS = 2", 1),
            ("EVAL_TRAJECTORY_COUNT = 30", "EVAL_TRAJECTORY_COUNT = 2", 1)]},
        base_models=("Qwen/Qwen3-30B-A3B-Instruct-2507",), env={"TINKER_API_KEY": "stand-in"},
        package="groupwise.pipeline_trainer", modules={"groupwise.tinker_native": "tinker_native"},
    )
    run_program(program, tmp_path, yes_no_maybe_model_dir)
    (run,) = [p.parent for p in tmp_path.rglob("history.jsonl")]
    history = gw.load_history(run)
    train = [r for r in history if r["split"] == "train"]
    assert [r["step"] for r in train] == [0, 1]
    assert all(r["n_groups"] >= 4 and 0 < r["reward"] < 1 for r in train)  # ART's min_batch_size, graded answers
    assert sorted(r["step"] for r in history if r["split"] == "val") == [2]  # EVAL_EVERY_N_STEPS = 2, not at start


def test_pipeline_trainer_binary_prefix_tool(binary_guess_model_dir, tmp_path):
    # ART's second PipelineTrainer example: a forced tool call whose argument is a guess of a secret bit
    # string, rewarded by the shared prefix; every size comes from the environment, as the program reads
    # it (no shrink); the base model writes bits, and most groups tie at a prefix of 0 (the program stops
    # at MAX_STEPS, so ample scenarios cost nothing and keep two trainable groups a step within reach)
    program = Program(
        PIPELINE + "binary_prefix_tool_pipeline.py", base_models=("Qwen/Qwen3-4B-Instruct-2507",),
        env={"MAX_STEPS": "2", "MIN_BATCH_SIZE": "2", "NUM_ROLLOUT_WORKERS": "4", "ROLLOUTS_PER_SCENARIO": "4",
             "MAX_BATCH_SIZE": "2", "MAX_TOKENS": "64", "SCENARIO_COUNT": "400", "EVAL_AT_START": "0",
             "RUN_SUFFIX": "test"},
        package="groupwise.pipeline_trainer", modules={"groupwise.tinker_native": "tinker_native"},
    )
    run_program(program, tmp_path, binary_guess_model_dir)
    (run,) = [p.parent for p in tmp_path.rglob("history.jsonl")]
    history = gw.load_history(run)
    train = [r for r in history if r["split"] == "train"]
    assert [r["step"] for r in train] == [0, 1]
    # the program's own metrics: the forced tool call was found and parsed, and guesses scored
    assert all(r["tool_call_found"] == 1.0 and r["reward"] > 0 for r in train), train
    assert sorted(r["step"] for r in history if r["split"] == "val") == [2]


SELF_PLAY = "examples/tic_tac_toe_self_play/"


@pytest.mark.parametrize("entry, steps", [("train.py", "300"), ("train_o4_mini.py", "200")])
def test_tic_tac_toe_self_play(entry, steps, art_model_dir, tmp_path, backup_bucket):
    """ART's self-play programs: their own gather helper, built on `art.gather`'s context, groups each
    game's two trajectories by player; o4-mini (at api.openai.com, a teacher in train.py, an opponent
    in train_o4_mini.py and in both programs' validation games) is a groupwise server of the tiny
    model serving it under the name "o4-mini"."""
    from groupwise.local import LocalBackend

    with LocalBackend(path=str(tmp_path / "openai")) as hosted:
        o4_mini = gw.TrainableModel(name="o4-mini", project="openai", base_model=art_model_dir)
        asyncio.run(o4_mini.register(hosted))
        program = Program(
            SELF_PLAY + entry,
            helpers=tuple(SELF_PLAY + f for f in ("rollout.py", "game_utils.py", "gather_trajectory_groups_by_index.py")),
            shrink={SELF_PLAY + entry: [(f"STEP = {steps}", "STEP = 1", 1), ("range(96)", "range(2)", 1),
                                        ("range(10)", "range(2)", 1)]},
            base_models=("meta-llama/Meta-Llama-3.1-8B-Instruct",),
            env={"OPENAI_API_KEY": o4_mini.inference_api_key},
            endpoints={"https://api.openai.com/v1": o4_mini.inference_base_url},
        )
        run_program(program, tmp_path, art_model_dir)
    name = "llama-8b-student-001" if entry == "train.py" else "llama-8b-o4-mini-001"
    rows = gw.load_history(tmp_path / ".groupwise" / "tic-tac-toe" / "models" / name)
    (train,) = [r for r in rows if r["split"] == "train"]
    # two groups (x's and o's trajectories, grouped by position in each game's pair); in train.py the
    # student plays both sides of both games, in train_o4_mini.py o4-mini takes one side of each
    assert (train["step"], train["n_groups"]) == (0, 2)
    assert train["n_trajectories"] == (4 if entry == "train.py" else 2)
    # the validation games against o4-mini were played (the program logs the student's side)
    (val,) = [r for r in rows if r["split"] == "val"]
    assert val["n_trajectories"] == 2
