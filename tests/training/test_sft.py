"""SFT: the masked NLL by hand, assistant-only targets rendered as the server renders them, an SFT step
on the trainer, and `train_sft` through LocalBackend as a step like any other (served, resumed, then GRPO)."""

from __future__ import annotations

import json

import pytest
import torch
from gw_train_helpers import make_choice

from groupwise.errors import ConfigError, NotTrainableError
from groupwise.chat.tool_calls import prepare_messages
from groupwise.training.sft import rendered_turn_ids, sft_loss, sft_sequence, tokenize_sft
from groupwise.core.trajectory import Trajectory

TOOLS = [{"type": "function", "function": {
    "name": "lookup", "description": "Look a word up.",
    "parameters": {"type": "object", "properties": {"word": {"type": "string"}}, "required": ["word"]}}}]


def _call(name, args, call_id="call_1"):
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}


def _demo():
    return [
        {"role": "system", "content": "You answer with the tool."},
        {"role": "user", "content": "What is a cat?"},
        {"role": "assistant", "content": None, "tool_calls": [_call("lookup", {"word": "cat"})]},
        {"role": "tool", "tool_call_id": "call_1", "content": "a small feline"},
        {"role": "assistant", "content": "A small feline."},
    ]


# ---------------------------------------------------------------------------------------------- loss
def test_sft_loss_by_hand():
    logprobs_BT = torch.tensor([[float("nan"), -1.0, -2.0], [-0.5, -3.0, 0.0]], requires_grad=True)
    mask_BT = torch.tensor([[0, 1, 1], [0, 1, 0]])
    terms = sft_loss(logprobs_BT, mask_BT, num_tokens=3)
    assert terms.loss.item() == pytest.approx((1 + 2 + 3) / 3)
    assert terms.nll_sum.item() == pytest.approx(6.0) and terms.tokens.item() == 3
    terms.loss.backward()
    # dL/dlog pi = -1/N on the targets, exactly 0 elsewhere (the NaN off the mask never leaks)
    assert torch.equal(logprobs_BT.grad, torch.tensor([[0, -1 / 3, -1 / 3], [0, -1 / 3, 0]]))
    # N is the whole update's: the same micro-batch inside an update of 6 target tokens weighs half
    assert sft_loss(logprobs_BT, mask_BT, num_tokens=6).loss.item() == pytest.approx(1.0)


def test_sft_loss_micro_batches_add_up_to_the_full_batch():
    g = torch.Generator().manual_seed(0)
    logprobs_BT = -torch.rand(6, 9, generator=g, dtype=torch.float64)
    mask_BT = torch.rand(6, 9, generator=g) > 0.4
    n = int(mask_BT.sum())
    full = sft_loss(logprobs_BT, mask_BT, num_tokens=n).loss
    parts = sum(sft_loss(logprobs_BT[i:i + 2], mask_BT[i:i + 2], num_tokens=n).loss for i in range(0, 6, 2))
    assert parts.item() == pytest.approx(full.item(), rel=1e-12)
    assert full.item() == pytest.approx(-logprobs_BT[mask_BT].mean().item(), rel=1e-12)


# ---------------------------------------------------------------------------------------------- tokenise
def test_targets_are_the_assistant_turns_as_the_server_renders_them(tokenizer):
    messages = _demo()
    ids, mask = sft_sequence(messages, tokenizer, tools=TOOLS)
    # The whole sequence is the server's rendering of the conversation (tools in the system prompt).
    prepared, template_tools = prepare_messages(messages, TOOLS, tokenizer)
    assert tokenizer.decode(ids) == tokenizer.apply_chat_template(prepared, tools=template_tools, tokenize=False)
    # Targets: the two assistant turns, each up to and including its end-of-turn token.
    spans, current = [], []
    for i, m in zip(ids, mask):
        if m:
            current.append(i)
        elif current:
            spans.append(current)
            current = []
    if current:
        spans.append(current)
    call = '<tool_call>\n{"name": "lookup", "arguments": {"word": "cat"}}\n</tool_call><|im_end|>'
    assert [tokenizer.decode(s) for s in spans] == [call, "A small feline.<|im_end|>"]
    assert spans[0] == tokenizer(call, add_special_tokens=False)["input_ids"]
    # the tool result, the question and the system prompt are context only
    context = tokenizer.decode([i for i, m in zip(ids, mask) if not m])
    assert "a small feline" in context and "What is a cat?" in context and "<tools>" in context


def test_end_of_turn_found_when_the_named_special_tokens_miss_it(tokenizer):
    # As transformers 5.17 builds SmolLM2's GGUF tokenizer: eos is <|im_start|> and <|im_end|> is only an
    # added special token. The turn must still end at <|im_end|>, not raise or run into the next turn.
    import copy

    odd = copy.deepcopy(tokenizer)
    odd.eos_token = "<|im_start|>"
    odd.pad_token = "<|endoftext|>"
    im_end = odd.convert_tokens_to_ids("<|im_end|>")
    if hasattr(odd, "extra_special_tokens"):
        odd.extra_special_tokens = []
    assert im_end not in odd.all_special_ids and odd.eos_token_id != im_end
    turn = rendered_turn_ids([{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Hello"}], 1, odd)
    assert odd.decode(turn) == "Hello<|im_end|>"


def test_sampled_token_ids_are_kept_and_last_turn_only(tokenizer):
    eos = tokenizer.eos_token_id
    # A non-canonical tokenisation (one id per character): token-in/token-out keeps it.
    sampled = [i for ch in "Cat" for i in tokenizer(ch, add_special_tokens=False)["input_ids"]] + [eos]
    items = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Hello"},
             {"role": "user", "content": "name an animal"}, make_choice(sampled, None, "Cat")]
    ids, mask = sft_sequence(items, tokenizer)
    trained = [i for i, m in zip(ids, mask) if m]
    hello = rendered_turn_ids([{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Hello"}],
                              1, tokenizer)
    assert trained == hello + sampled
    ids, mask = sft_sequence(items, tokenizer, assistant_turns="last")
    assert [i for i, m in zip(ids, mask) if m] == sampled
    assert "Hello" in tokenizer.decode(ids)  # the earlier turn stays as context


def test_nothing_to_imitate_is_a_loud_error(tokenizer):
    no_assistant = Trajectory(messages_and_choices=[{"role": "user", "content": "hi"}])
    with pytest.raises(NotTrainableError, match="no assistant turn"):
        tokenize_sft([no_assistant], tokenizer, max_seq_len=512)
    long = Trajectory(messages_and_choices=[{"role": "user", "content": "word " * 300},
                                            {"role": "assistant", "content": "ok"}])
    with pytest.raises(NotTrainableError, match="max_seq_len=64"):
        tokenize_sft([long], tokenizer, max_seq_len=64)


def test_config_checks_the_rate_list_against_the_batches():
    import groupwise as gw

    config = gw.TrainSFTConfig(learning_rate=[1e-4, 5e-5], batch_size=3)
    assert config.rates(2) == [1e-4, 5e-5]
    with pytest.raises(ConfigError, match="2 rates but the trajectories make 3 batches"):
        config.rates(3)
    with pytest.raises(ConfigError) as err:
        gw.TrainSFTConfig(learning_rate=-1.0, batch_size=0, assistant_turns="first")
    assert len(err.value.problems) == 3
    assert gw.TrainSFTConfig().resolved_batch_size() == 2  # 'auto', as ART's LocalBackend


# ---------------------------------------------------------------------------------------------- trainer
def test_sft_step_loss_is_the_nll_of_the_targets_and_falls(tiny_model, tokenizer):
    from groupwise.config import LoraConfig, TrainConfig
    from groupwise.training.adapters import wrap_with_lora
    from groupwise.training.trainer import Trainer

    model = wrap_with_lora(tiny_model, LoraConfig(rank=4))
    trainer = Trainer(model, pad_token_id=tokenizer.pad_token_id)
    demos = [Trajectory(messages_and_choices=_demo(), tools=TOOLS),
             Trajectory(messages_and_choices=[{"role": "user", "content": "hi"}, {"role": "assistant", "content": "ok"}])]
    batch = tokenize_sft(demos, tokenizer, max_seq_len=2048)
    # The NLL computed independently: a plain HF forward, log-softmax, the targets' mean.
    nll, n = 0.0, 0
    with torch.no_grad():
        for s in batch.sequences:
            logits = model(input_ids=torch.tensor([s.input_ids])).logits[0].double().log_softmax(-1)
            for t in range(1, len(s)):
                if s.mask[t]:
                    nll -= logits[t - 1, s.input_ids[t]].item()
                    n += 1
    config = TrainConfig(learning_rate=3e-3, micro_batch_tokens=256)  # several micro-batches
    first = trainer.train_step(batch, config, objective="sft")
    assert first["trainable_tokens"] == n and first["micro_batches"] >= 2
    assert first["loss"] == pytest.approx(nll / n, rel=1e-5)
    losses = [first["loss"]] + [trainer.train_step(batch, config, objective="sft")["loss"] for _ in range(5)]
    # (a tiny random model with a frozen tied head starts near uniform, ln 49152 = 10.8, and moves slowly)
    assert losses == sorted(losses, reverse=True) and losses[-1] < losses[0] - 0.2


# ---------------------------------------------------------------------------------------------- backend
async def test_train_sft_is_a_step_then_grpo_continues(tiny_model_dir, tmp_path):
    import groupwise as gw

    model = gw.TrainableModel(name="agent", project="p", base_model=tiny_model_dir)
    backend = gw.LocalBackend(path=str(tmp_path), best_checkpoint_metric=None)
    await model.register(backend)
    client = model.openai_client()
    ask = [{"role": "user", "content": "Say the code."}]
    demo = gw.Trajectory(messages_and_choices=[*ask, {"role": "assistant", "content": "zebra"}])
    try:
        before = await client.chat.completions.create(model=model.name, messages=ask, max_tokens=4, temperature=0)
        assert not before.choices[0].message.content.startswith("zebra")
        # One step of 20 updates (batches of 2 copies; as ART, a learning rate per batch).
        result = await model.train_sft([demo] * 40, gw.TrainSFTConfig(learning_rate=[1e-2] * 20, batch_size=2))
        assert result.step == 1 and await model.get_step() == 1
        assert result.metrics["updates"] == 20 and result.metrics["last_loss"] < result.metrics["first_loss"]
        run = tmp_path / "p" / "models" / "agent"
        assert (run / "checkpoints" / "0001" / "state.json").is_file()
        row = [r for r in gw.load_history(run) if r["split"] == "sft"][-1]
        assert row["step"] == 0 and row["loss"] == pytest.approx(result.metrics["loss"])
        stored = gw.load_trajectories(run, "sft", 0)
        assert sum(len(g.trajectories) for g in stored) == 40
        # The new adapter is served and it imitates the demonstration (a tiny random model's frozen tied
        # head keeps its logits near uniform, so it learns the argmax, not yet where to stop).
        after = await client.chat.completions.create(model=model.name, messages=ask, max_tokens=4, temperature=0)
        assert after.model == "agent@1" and after.choices[0].message.content.startswith("zebra")
        # GRPO continues from the SFT step.
        groups = []
        for g in range(2):
            trajs = []
            for i in range(4):
                r = await client.chat.completions.create(model=model.name, messages=ask, max_tokens=3, seed=10 * g + i)
                trajs.append(gw.Trajectory(messages_and_choices=[*ask, r.choices[0]], reward=float(i)))
            groups.append(gw.TrajectoryGroup(trajs))
        assert (await model.train(groups, config=gw.TrainConfig(learning_rate=1e-4))).step == 2
    finally:
        await backend.close()
    # A restarted process resumes at step 2 (the SFT step's checkpoint was an ordinary one).
    again = gw.LocalBackend(path=str(tmp_path))
    clone = gw.TrainableModel(name="agent", project="p", base_model=tiny_model_dir)
    await clone.register(again)
    try:
        assert await clone.get_step() == 2
    finally:
        await again.close()


async def test_backend_without_sft_says_so(tmp_path):
    import groupwise as gw
    from groupwise.backend.base import Backend

    class Minimal(Backend):
        async def register(self, model): ...
        def inference_endpoint(self, model): ...
        async def train(self, model, groups, config): ...
        async def get_step(self, model): return 0

    model = gw.TrainableModel(name="m", project="p", base_path=str(tmp_path))
    with pytest.raises(NotImplementedError, match="Minimal does not implement train_sft"):
        await Minimal().train_sft(model, [], gw.TrainSFTConfig())
