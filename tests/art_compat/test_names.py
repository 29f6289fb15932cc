"""Each ART name at ART's path, and each ART argument: applied where it maps, named once where not.
Fast: no model is loaded here (the programs in the other files load the tiny one)."""

from __future__ import annotations

import subprocess
from pathlib import Path
import sys
import warnings

import pytest

import groupwise as art
from groupwise.backend.base import Backend, InferenceEndpoint, TrainResult
from groupwise.core.compat import train_config_from_art


def test_art_import_paths_resolve_without_importing_torch():
    code = (
        "import sys, groupwise as art\n"
        "from groupwise.local import LocalBackend\n"
        "from groupwise.local.backend import LocalBackend as B2\n"
        "from groupwise.rewards import ruler_score_group, ruler\n"
        "from groupwise.rewards.ruler import ruler_score_group as r2\n"
        "from groupwise.core.iterate_dataset import iterate_dataset\n"
        "from groupwise.utils import limit_concurrency, retry\n"
        "from groupwise.trajectories import Trajectory, TrajectoryGroup, History, PydanticException, LegacyHistory\n"
        "from groupwise.utils.litellm import convert_litellm_choice_to_openai\n"
        "from groupwise.utils.litellm_utils import convert_litellm_choice_to_openai as c02\n"
        "from groupwise.core.trajectory import TrainConfig, TrainSFTConfig, TrainResult, LocalTrainResult, Verbosity\n"
        "from groupwise.trajectories import get_messages\n"
        "from groupwise.utils.sft import train_sft_from_file, create_sft_dataset_iterator\n"
        "from groupwise.utils.get_trajectory_messages import get_trajectory_messages\n"
        "assert Trajectory is art.Trajectory and TrajectoryGroup is art.TrajectoryGroup\n"
        "from groupwise.dev import InternalModelConfig, InitArgs, EngineArgs, PeftArgs, TrainConfig, LoRAConfig\n"
        "assert LocalBackend is B2 and ruler_score_group is r2\n"
        "names = [art.Messages, art.MessagesAndChoices, art.Tools, art.trajectory_group, art.dev.TrainerArgs,\n"
        "         art.TrainResult, art.LocalTrainResult, art.LoRAConfig, art.limit_concurrency, art.rewards.ruler]\n"
        "print('torch' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"


def test_art_dev_configs_build_as_plain_dicts():
    config = art.dev.InternalModelConfig(
        init_args=art.dev.InitArgs(max_seq_length=8192),
        engine_args=art.dev.EngineArgs(enforce_eager=True),
        peft_args=art.dev.PeftArgs(r=4, lora_alpha=8),
        tinker_args=art.dev.TinkerArgs(renderer_name="qwen3", training_client_args=art.dev.TinkerTrainingClientArgs(rank=1)),
    )
    assert config["peft_args"] == {"r": 4, "lora_alpha": 8}


def test_lora_settings_of_each_art_generation_map_onto_the_adapter(tmp_path):
    default = art.LoraConfig()
    old = art.TrainableModel(name="a", project="p", base_model="m", base_path=str(tmp_path),
                             _internal_config=art.dev.InternalModelConfig(peft_args=art.dev.PeftArgs(r=4, lora_alpha=8, random_state=3)))
    assert (old.lora_for(default).rank, old.lora_for(default).alpha, old.lora_for(default).seed) == (4, 8, 3)
    new = art.TrainableModel(name="b", run_name="b-run", project="p", base_model="m", base_path=str(tmp_path),
                             lora_config=art.LoRAConfig(rank=2, alpha=4, dropout=0.0, target_modules=["q_proj"]))
    lora = new.lora_for(default)
    assert (lora.rank, lora.alpha, lora.target_modules) == (2, 4, ("q_proj",))
    assert new.run_dir == tmp_path / "p" / "models" / "b-run" and new.name == "b"  # run_name names the folder
    # assigned after construction, as the 2048 example does; the vLLM part is named, not applied
    late = art.TrainableModel(name="c", project="p", base_model="m", base_path=str(tmp_path))
    late._internal_config = art.dev.InternalModelConfig(engine_args=art.dev.EngineArgs(enforce_eager=True),
                                                        peft_args=art.dev.PeftArgs(r=16))
    with pytest.warns(art.ArtCompatWarning, match="engine_args"):
        assert late.lora_for(default).rank == 16


def test_train_config_accepts_arts_kl_names_and_arts_options_map_or_warn_once():
    assert art.TrainConfig(beta=0.04).kl_coef == 0.04
    assert art.TrainConfig(kl_penalty_coef=0.1).kl_coef == 0.1
    with pytest.raises(art.ConfigError, match="disagree"):
        art.TrainConfig(beta=0.1, kl_penalty_coef=0.2)
    with pytest.warns(art.ArtCompatWarning, match="grad_accumulation_sequences"):  # ART 0.5.2x's own fields
        assert art.TrainConfig(learning_rate=2e-5, grad_accumulation_sequences=4, kl_penalty_source="sample").learning_rate == 2e-5
    with pytest.warns(art.ArtCompatWarning, match="precalculate_logprobs") as seen:
        config = train_config_from_art(art.TrainConfig(learning_rate=3e-5),
                                       {"logprob_calculation_chunk_size": 8, "precalculate_logprobs": True,
                                        "loss_fn": "cispo", "epsilon_high": 4.0}, where="test-once")
    assert (config.learning_rate, config.logprob_chunk_size, config.loss, config.epsilon_high) == (3e-5, 8, "cispo", 4.0)
    assert len([w for w in seen if issubclass(w.category, art.ArtCompatWarning)]) == 1
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # named once per process: the second call is silent
        train_config_from_art(None, {"precalculate_logprobs": True, "learning_rate": 1e-5}, where="test-once")
    with pytest.raises(art.ConfigError, match="learning_rat"):
        train_config_from_art(None, {"learning_rat": 1e-5}, where="test")
    # ART's KL anchor is a checkpoint step of the run (0: the base), as groupwise's
    anchored = train_config_from_art(None, {"kl_penalty_coef": 0.1, "kl_penalty_reference_step": 3}, where="test")
    assert (anchored.kl_coef, anchored.kl_reference_step) == (0.1, 3)


class _Recorder(Backend):
    """A Backend with no model, enough to check what a model asks of it."""

    path = "/nonexistent"

    async def register(self, model):
        pass

    def inference_endpoint(self, model):
        return InferenceEndpoint(base_url="http://x.invalid/v1", api_key="k")

    async def train(self, model, groups, config):
        return TrainResult(step=1)

    async def get_step(self, model):
        return 0


async def test_model_backend_is_arts_method_and_groupwises_property(tmp_path):
    model = art.TrainableModel(name="m", project="p", base_model="x", base_path=str(tmp_path))
    backend = _Recorder()
    await model.register(backend)
    assert model.backend() is backend and model.backend is backend
    assert model.inference_base_url is None  # this backend serves nothing over HTTP


async def test_prompted_model_registers_logs_beside_the_trained_one_and_keeps_arts_fields(tmp_path):
    import warnings

    with warnings.catch_warnings():  # entity is W&B's (groupwise.runs.wandb_log), not ignored any more
        warnings.simplefilter("error", art.ArtCompatWarning)
        gpt = art.Model(name="gpt-4o-mini", project="p", entity="my-team", config={"temperature": 0.3},
                        inference_model_name="gpt-4o-mini", inference_base_url="http://x.invalid/v1",
                        inference_api_key="k")
    backend = _Recorder()
    backend.path = str(tmp_path)
    await gpt.register(backend)
    assert gpt.config == {"temperature": 0.3} and gpt.backend() is backend
    group = art.TrajectoryGroup([art.Trajectory(messages_and_choices=[{"role": "user", "content": "q"}], reward=1.0)])
    await gpt.log([group], split="val")
    row = await gpt.log(metrics={"win_rate": 0.5}, step=3)  # metrics only, as ART's model.log(metrics=, step=)
    assert row["win_rate"] == 0.5 and "reward" not in row and row["split"] == "val" and row["step"] == 3
    history = art.load_history(tmp_path / "p" / "models" / "gpt-4o-mini")
    assert [(r["step"], r.get("reward")) for r in history] == [(0, 1.0), (3, None)]


async def test_metrics_logged_after_a_steps_trajectories_are_added_to_its_row(tmp_path):
    """ART appends every model.log call as a row. Here a row is one per step and split (a resumed run
    never counts one twice), so metrics logged after the step's trajectories are added to that row, not
    put in place of it (which dropped its reward, what the best checkpoint is chosen by); logging the
    same step's trajectories twice says so."""
    gpt = art.Model(name="gpt", project="p", base_path=str(tmp_path))
    t = art.Trajectory(messages_and_choices=[{"role": "user", "content": "q"}], reward=0.5, metrics={"acc": 1.0})
    await gpt.log([t], split="val")
    row = await gpt.log(metrics={"judge_agreement": 0.7})
    assert (row["reward"], row["acc"], row["judge_agreement"]) == (0.5, 1.0, 0.7)
    assert [(r["step"], r["split"], r["reward"], r["judge_agreement"]) for r in art.load_history(gpt.store.run_dir)] == [
        (0, "val", 0.5, 0.7)]
    from groupwise.errors import GroupwiseWarning

    with pytest.warns(GroupwiseWarning, match="step 0 of split 'val' was logged already.*split of its own"):
        await gpt.log([t.model_copy(update={"reward": 0.25})], split="val")
    assert [r["reward"] for r in art.load_history(gpt.store.run_dir)] == [0.25]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        await gpt.log([t], split="val_hard")  # its own split: no warning


def test_local_backend_accepts_arts_constructor(tmp_path):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        art.LocalBackend(in_process=True, path=str(tmp_path))  # what groupwise always does: nothing to say
    with pytest.warns(art.ArtCompatWarning, match="gpu_cost_per_hour_usd"):
        art.LocalBackend(in_process=False, path=str(tmp_path), gpu_cost_per_hour_usd=3.0)


async def test_s3_backup_is_a_local_folder_and_says_so_for_s3_urls(tmp_path, monkeypatch):
    backend = art.LocalBackend(path=str(tmp_path))
    model = art.TrainableModel(name="m", project="p", base_model="x")
    monkeypatch.delenv("BACKUP_BUCKET", raising=False)
    with pytest.raises(art.ConfigError, match="BACKUP_BUCKET"):
        await backend._experimental_push_to_s3(model)
    with pytest.raises(art.GroupwiseError, match="does not talk to S3"):
        await backend._experimental_push_to_s3(model, s3_bucket="s3://my-bucket")
    with pytest.raises(art.GroupwiseError, match="no checkpoints of model 'other'"):  # a fork needs a source run
        await backend._experimental_fork_checkpoint(model, from_model="other")


async def test_art_utils_s3_push_and_pull_a_run_through_the_bucket_folder(tmp_path, monkeypatch):
    """`art.utils.s3`'s functions (what ART's benchmarking notebooks call) copy a run folder to and from
    the bucket folder where the backend's own backup methods put it."""
    from groupwise.runs.output_dirs import get_output_dir_from_model_properties
    from groupwise.runs.s3 import pull_model_from_s3, push_model_to_s3

    bucket, here, there = tmp_path / "bucket", tmp_path / "here", tmp_path / "there"
    monkeypatch.setenv("BACKUP_BUCKET", str(bucket))
    run = tmp_path / "here" / "p" / "models" / "m"
    for rel in ("checkpoints/0001/a.bin", "checkpoints/0002/a.bin", "trajectories/train/0001.jsonl", "history.jsonl",
                "checkpoints/.tmp-3-7/a.bin", "checkpoints/.deleted-0000-1/a.bin"):  # being written; deleted
        (run / rel).parent.mkdir(parents=True, exist_ok=True)
        (run / rel).write_text(rel)
    assert get_output_dir_from_model_properties("p", "m", str(here)) == str(run)
    with pytest.raises(art.GroupwiseError, match="nothing to push"):
        await push_model_to_s3("other", "p", art_path=str(here))
    await push_model_to_s3("m", "p", art_path=str(here))
    assert (bucket / "p" / "models" / "m" / "checkpoints" / "0002" / "a.bin").read_text() == "checkpoints/0002/a.bin"
    assert sorted(p.name for p in (bucket / "p" / "models" / "m" / "checkpoints").iterdir()) == ["0001", "0002"]

    # one checkpoint; then all but the trajectories; the run folder is returned, as ART's
    got = await pull_model_from_s3("m", "p", step=1, art_path=str(there))
    assert got == str(there / "p" / "models" / "m")
    assert sorted(p.relative_to(got).as_posix() for p in Path(got).rglob("*") if p.is_file()) == ["checkpoints/0001/a.bin"]
    await pull_model_from_s3("m", "p", art_path=str(there), exclude=["trajectories"])
    assert sorted(p.relative_to(got).as_posix() for p in Path(got).rglob("*") if p.is_file()) == [
        "checkpoints/0001/a.bin", "checkpoints/0002/a.bin", "history.jsonl"]
    # the backend's restore reads the same copy
    backend = art.LocalBackend(path=str(tmp_path / "third"))
    await backend._experimental_pull_from_s3(art.TrainableModel(name="m", project="p", base_model="x"))
    assert (tmp_path / "third" / "p" / "models" / "m" / "trajectories" / "train" / "0001.jsonl").is_file()
    # nothing backed up yet is not an error (ART's sync of an empty prefix); a wrong option is
    assert await pull_model_from_s3("new", "p", art_path=str(there)) == str(there / "p" / "models" / "new")
    with pytest.raises(art.ConfigError, match="exclude"):
        await pull_model_from_s3("m", "p", art_path=str(there), exclude=["weights"])


def test_train_and_log_take_arts_keyword_names():
    """ART programs pass these by keyword (prisoners-dilemma, codenames, tic-tac-toe self-play:
    `model.train(trajectory_groups=[...], config=...)`)."""
    import inspect

    for method, names in ((art.TrainableModel.train, ["trajectory_groups", "config", "_config", "verbose"]),
                          (art.Model.log, ["trajectories", "split"])):
        assert list(inspect.signature(method).parameters)[1:len(names) + 1] == names, method


def test_get_trajectory_messages_at_arts_path():
    from groupwise.core.trajectory import Choice
    from groupwise.utils.get_trajectory_messages import get_trajectory_messages

    choice = Choice.model_validate({"index": 0, "finish_reason": "stop",
                                    "message": {"role": "assistant", "content": "<move>left</move>"}})
    t = art.Trajectory(messages_and_choices=[{"role": "user", "content": "board"}, choice])
    assert get_trajectory_messages(t) == [{"role": "user", "content": "board"},
                                          {"role": "assistant", "content": "<move>left</move>"}]


def test_get_messages_at_arts_path():
    from groupwise.trajectories import get_messages
    from groupwise.core.trajectory import Choice

    choice = Choice.model_validate({"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": "4"}})
    assert get_messages([{"role": "user", "content": "2+2?"}, choice]) == [
        {"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"}]


def test_additional_histories_as_arts_later_docs_write_them():
    """ART's additional-histories docs name the side conversation `LegacyHistory`: a sub-agent's
    conversation beside the main one, kept through a store round trip."""
    from groupwise.trajectories import LegacyHistory, Trajectory

    sub_agent = LegacyHistory(messages_and_choices=[
        {"role": "system", "content": "You are a code analysis expert"},
        {"role": "user", "content": "Find potential bugs in main.py"},
        {"role": "assistant", "content": "Found 3 potential issues..."}])
    trajectory = Trajectory(
        messages_and_choices=[{"role": "user", "content": "Analyze this codebase and fix any bugs"},
                              {"role": "assistant", "content": "Fixed by adding a null check"}],
        additional_histories=[sub_agent], reward=0.8, metrics={"task_completed": True})
    again = Trajectory.model_validate_json(trajectory.model_dump_json())
    assert isinstance(again.additional_histories[0], LegacyHistory) and LegacyHistory is art.types.History
    assert again.additional_histories[0].messages_and_choices[1]["content"] == "Find potential bugs in main.py"
    assert (again.reward, again.metrics) == (0.8, {"task_completed": 1})


def test_configs_answer_arts_pydantic_calls_and_its_kl_names():
    """ART's TrainConfig is a pydantic model: a program (or a remote backend's client) serialises it with
    model_dump(mode="json") and reads `beta` back. Here the config is a dataclass that answers the same."""
    import json

    config = art.TrainConfig(learning_rate=2e-5, beta=0.01)
    assert (config.beta, config.kl_penalty_coef, config.kl_coef) == (0.01, 0.01, 0.01)
    assert art.TrainConfig().beta == 0.0 == art.TrainConfig().kl_penalty_coef  # ART's default
    dumped = config.model_dump(mode="json")
    assert json.loads(json.dumps(dumped)) == dumped and dumped["learning_rate"] == 2e-5
    assert art.TrainConfig.model_validate(dumped) == config == art.TrainConfig.model_validate(config)
    assert json.loads(config.model_dump_json())["kl_coef"] == 0.01
    assert config.model_copy(update={"learning_rate": 3e-5}).learning_rate == 3e-5
    with pytest.raises(art.ConfigError, match="learning_rate"):
        config.model_copy(update={"learning_rate": -1.0})
    assert art.TrainSFTConfig().model_dump()["learning_rate"] == art.TrainSFTConfig().learning_rate


def test_arts_module_paths_of_dev_types_and_backend_aliases():
    from groupwise.backend import AnyModel, AnyTrainableModel
    from groupwise.dev.engine import EngineArgs
    from groupwise.dev.model import InitArgs, InternalModelConfig, PeftArgs, TrainerArgs
    from groupwise.dev.openai_server import OpenAIServerConfig
    from groupwise.dev.train import TrainConfig

    assert (InternalModelConfig, InitArgs, PeftArgs, TrainerArgs, EngineArgs, OpenAIServerConfig, TrainConfig) == (
        art.dev.InternalModelConfig, art.dev.InitArgs, art.dev.PeftArgs, art.dev.TrainerArgs, art.dev.EngineArgs,
        art.dev.OpenAIServerConfig, art.dev.TrainConfig)
    assert (AnyModel, AnyTrainableModel) == ("Model[Any, Any]", "TrainableModel[Any, Any]")


def test_art_configs_drop_a_keyword_they_do_not_know_with_a_warning():
    # ART's TrainConfig and TrainSFTConfig are pydantic models: TrainConfig(batch_size=1) runs there
    import warnings

    import groupwise as art
    from groupwise.errors import ArtCompatWarning

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        config = art.TrainConfig(learning_rate=2e-5, batch_size=1, learnig_rate_typo=3)
        sft = art.TrainSFTConfig(batch_size=4, num_epochs=2)
    assert config.learning_rate == 2e-5 and sft.batch_size == 4
    texts = [str(w.message) for w in caught if issubclass(w.category, ArtCompatWarning)]
    assert any("batch_size" in t and "learnig_rate_typo: did you mean learning_rate?" in t for t in texts), texts
    assert any("TrainSFTConfig" in t and "num_epochs" in t for t in texts), texts
    with pytest.raises(art.ConfigError):  # a known setting's bad value is still an error
        art.TrainConfig(learning_rate=-1.0, batch_size=1)


def test_the_runner_ports_an_art_import_among_other_names():
    """`import asyncio, art` (a public program's first line) becomes `import asyncio, groupwise as art`; the
    runner's port used to leave it, and the program failed with `No module named 'art'`."""
    sys.path.insert(0, str(Path(__file__).parent))
    try:
        from art_runner import port
    finally:
        sys.path.pop(0)
    assert port("import asyncio, art\nimport art, os\nimport os, art, re\nimport artistic, os\nimport art\n") == (
        "import asyncio, groupwise as art\nimport groupwise as art, os\nimport os, groupwise as art, re\n"
        "import artistic, os\nimport groupwise as art\n")
