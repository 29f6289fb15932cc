"""ART's example programs that reach external services (a Hugging Face hub data set, a reward model
served on Modal, ...), run as ART wrote them (art_repo/, OpenPipe/ART at art_runner.ART_COMMIT) with
only the import changed, against local stand-ins of those services with the same interface (see
art_runner's seams), each through at least one training step on the tiny random model.
"""

from __future__ import annotations

from datetime import datetime

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
    train = [r for r in gw.load_history(tmp_path / ".groupwise" / "hn_title_generation" / "001")
             if r["split"] == "train"]
    assert [r["step"] for r in train] == [0]
    # the program's own metrics, per trajectory: the reward model's score and the title's length
    assert {"rm", "length", "matches"} <= {k.split("/")[-1] for k in train[0]}, sorted(train[0])
