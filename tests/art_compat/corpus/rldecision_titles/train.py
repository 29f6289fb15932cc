# Third-party ART program, restated for groupwise's tests (corpus/README.md says how and why):
# johnson7788/RLDecisionAgent, backend/ART_title_generator/train.py. Single-turn title generation:
# a base-model check that the title matches the story, a local reward model's score, lists of
# trajectories passed to model.train, periodic validation with gather_trajectories, model.log and
# delete_checkpoints. Every use of ART is kept call for call; data and prompts are shortened.
import asyncio
from typing import Any, Dict, Iterable, List

import openai
from dotenv import load_dotenv
from openai.types.chat import ChatCompletionMessageParam
from transformers.models.auto.tokenization_auto import AutoTokenizer
from utils import cache, prompt_for_title, pull_data, score_title

import art
from art.local import LocalBackend
from art.utils import iterate_dataset, limit_concurrency

load_dotenv()

MODEL_NAME = "001"
BASE_MODEL = "Qwen/Qwen2.5-0.5B-Instruct"
MAX_COMPLETION_LENGTH = 100
MAX_PROMPT_LENGTH = 8192 - MAX_COMPLETION_LENGTH
LEARNING_RATE = 1.2e-5
GROUPS_PER_STEP = 1
EVAL_STEPS = 50
VAL_SET_SIZE = 100
TRAINING_DATASET_SIZE = 5000
PROJECT = "hn_title_generation"
NUM_EPOCHS = 1
NUM_GENERATIONS = 6


def filter_on_length(data, max_length: int, tokenizer_name: str):
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_name)
    return data.filter(lambda x: len(tokenizer.apply_chat_template(x["prompt"], tokenize=True,
                                                                   add_generation_prompt=True)) <= max_length)


@cache.cache()
async def load_data(split="train", max_items=10, min_score=20, max_length=8192, tokenizer_name=BASE_MODEL):
    data = pull_data(split=split, max_items=max_items, min_score=min_score)
    data = data.filter(lambda x: isinstance(x.get("scraped_body"), str) and x["scraped_body"].strip())
    data = data.map(lambda x: {"prompt": prompt_for_title(x["scraped_body"]), "row": x})
    return filter_on_length(data, max_length, tokenizer_name)


@limit_concurrency(10)
async def call_score_title(row_with_title: Dict[str, Any]) -> float:
    return await score_title(row_with_title, "rm")


async def check_title_matches_body(client: openai.AsyncOpenAI, body: str, title: str) -> int:
    messages: Iterable[ChatCompletionMessageParam] = [
        {"role": "system", "content": "Return True if the title's claims are in the article, else False."},
        {"role": "user", "content": f"<article>{body}</article>\n<proposed_title>{title}</proposed_title>"},
    ]
    try:
        response = await client.chat.completions.create(model=BASE_MODEL, messages=messages, max_tokens=5,
                                                         temperature=0.0)
        content = (response.choices[0].message.content or "").strip().lower()
        return 0 if content.startswith("false") else 1
    except Exception as e:
        print(f"title check failed: {e}")
        return 0


async def rollout(client: openai.AsyncOpenAI, model_name: str, prompt, row, global_step: int, epoch: int) -> art.Trajectory:
    metrics = {}
    chat_completion = await client.chat.completions.create(messages=prompt, model=model_name,
                                                           max_tokens=MAX_COMPLETION_LENGTH, temperature=1, logprobs=True)
    choice = chat_completion.choices[0]
    generated_title = choice.message.content or ""
    metrics["length"] = len(generated_title)
    title_matches = await check_title_matches_body(client, row["scraped_body"], generated_title)
    metrics["matches"] = title_matches
    rm_score = await asyncio.wait_for(call_score_title({**row, "title": generated_title}), timeout=30)
    metrics["rm"] = rm_score
    return art.Trajectory(messages_and_choices=[*prompt, choice], reward=0.0 if title_matches == 0 else rm_score,
                          metrics=metrics)


async def main():
    backend = LocalBackend()
    model = art.TrainableModel(
        name=MODEL_NAME, project=PROJECT, base_model=BASE_MODEL,
        _internal_config=art.dev.InternalModelConfig(
            init_args=art.dev.InitArgs(gpu_memory_utilization=0.75),
            peft_args=art.dev.PeftArgs(lora_alpha=8),
            trainer_args=art.dev.TrainerArgs(max_grad_norm=0.1),
        ),
    )
    await model.register(backend)
    train_dataset = await load_data(split="train", max_items=TRAINING_DATASET_SIZE, max_length=MAX_PROMPT_LENGTH,
                                    tokenizer_name=BASE_MODEL)
    val_dataset = await load_data("val", max_items=VAL_SET_SIZE, max_length=MAX_PROMPT_LENGTH, tokenizer_name=BASE_MODEL)
    val_data_list: List[Dict[str, Any]] = list(val_dataset)
    train_data_list: List[Dict[str, Any]] = list(train_dataset)
    openai_client = model.openai_client()
    data_iterator = iterate_dataset(dataset=train_data_list, groups_per_step=GROUPS_PER_STEP, num_epochs=NUM_EPOCHS,
                                    initial_step=await model.get_step(), use_tqdm=True)
    for batch in data_iterator:
        train_groups = await art.gather_trajectory_groups(
            (art.TrajectoryGroup(rollout(openai_client, MODEL_NAME, bi["prompt"], bi["row"], batch.step, batch.epoch)
                                 for _ in range(NUM_GENERATIONS))
             for bi in batch.items))
        valid_train_groups = []
        for group in train_groups:
            valid_group = [traj for traj in group if isinstance(traj, art.Trajectory)]
            if len(valid_group) > 1:
                valid_train_groups.append(valid_group)
        if not valid_train_groups:
            continue
        await model.train(valid_train_groups, config=art.TrainConfig(learning_rate=LEARNING_RATE))
        if batch.step > 0 and batch.step % EVAL_STEPS == 0:
            val_trajectories = await art.gather_trajectories(
                (rollout(openai_client, MODEL_NAME, item["prompt"], item["row"], batch.step, batch.epoch)
                 for item in val_data_list), pbar_desc="val")
            await model.log(val_trajectories)
            await model.delete_checkpoints()


if __name__ == "__main__":
    asyncio.run(main())
