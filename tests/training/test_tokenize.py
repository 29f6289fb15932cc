"""Token-in/token-out: sampled ids and logprobs are spliced in exactly; the loss mask covers every Choice."""

from __future__ import annotations

import math

import pytest
from gw_train_helpers import make_choice

from groupwise.errors import NotTrainableError
from groupwise.training.tokenize import tokenize_conversation, tokenize_groups
from groupwise.core.trajectory import Choice, History, Trajectory, TrajectoryGroup


def _ids(tokenizer, text):
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def test_compact_logprobs_are_spliced_like_entries(tokenizer):
    """A choice whose logprobs came as one list (``token_logprobs``, groupwise.core.choices.TOKEN_DATA_HEADER)
    tokenises exactly like the same choice with per-token entries, through the store's JSON too."""
    turn = _ids(tokenizer, " fine thanks") + [tokenizer.eos_token_id]
    lps = [-0.25 * (k + 1) for k in range(len(turn))]
    compact = Choice.model_validate({"index": 0, "finish_reason": "stop", "logprobs": None, "token_ids": turn,
                                     "token_logprobs": lps, "message": {"role": "assistant", "content": " fine thanks"}})
    user = {"role": "user", "content": "how are you?"}
    full = tokenize_conversation([user, make_choice(turn, lps, " fine thanks")], tokenizer)
    assert tokenize_conversation([user, compact], tokenizer) == full
    assert [x for x, m in zip(full[2], full[1]) if m] == lps
    stored = Trajectory.model_validate_json(Trajectory(messages_and_choices=[user, compact]).model_dump_json())
    assert tokenize_conversation(stored.messages_and_choices, tokenizer) == full


def test_multi_turn_choices_are_spliced_exactly(tokenizer):
    eos = tokenizer.eos_token_id  # <|im_end|>, sampled at the end of each turn
    # A NON-canonical tokenisation of "hello": one id per character. Re-tokenising the text would give
    # other ids; token-in/token-out must keep these.
    turn1 = [i for ch in "hello" for i in _ids(tokenizer, ch)] + [eos]
    assert turn1[:-1] != _ids(tokenizer, "hello")
    turn2 = _ids(tokenizer, " fine") + [eos]
    lp1 = [-0.1 * (k + 1) for k in range(len(turn1))]
    lp2 = [-0.5] * len(turn2)
    items = [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "hi"},
        make_choice(turn1, lp1, "hello"),
        {"role": "user", "content": "how are you?"},
        {"role": "assistant", "content": "context only"},  # plain dict: context, not trained
        {"role": "user", "content": "and now?"},
        make_choice(turn2, lp2, " fine"),
    ]
    ids, mask, old = tokenize_conversation(items, tokenizer)
    trained = [i for i, m in zip(ids, mask) if m]
    assert trained == turn1 + turn2
    assert [x for x, m in zip(old, mask) if m] == lp1 + lp2
    assert all(math.isnan(x) for x, m in zip(old, mask) if not m)
    # The text is what the chat template renders (the template's own <|im_end|> is not doubled).
    rendered = tokenizer.apply_chat_template(
        [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"},
         {"role": "assistant", "content": "hello"}, {"role": "user", "content": "how are you?"},
         {"role": "assistant", "content": "context only"}, {"role": "user", "content": "and now?"},
         {"role": "assistant", "content": " fine"}],
        tokenize=False,
    )
    assert tokenizer.decode(ids) == rendered
    assert tokenizer.decode([i for i, m in zip(ids, mask) if not m]).count("context only") == 1


def _traj(reward, ids=(5, 6, 7), histories=()):
    return Trajectory(
        messages_and_choices=[{"role": "user", "content": "q"}, make_choice(list(ids), [-1.0] * len(ids))],
        additional_histories=list(histories),
        reward=reward,
    )


def test_an_appended_item_that_is_no_message_fails_loudly(tokenizer):
    """`traj.messages_and_choices.append(choice.message)` skips the Trajectory's validation; such a turn
    rendered as context and never trained, beside turns that did. It now fails the step, saying what to
    append."""
    from openai.types.chat import ChatCompletionMessage

    from groupwise.errors import InvalidDataError

    traj = Trajectory(messages_and_choices=[{"role": "user", "content": "hi"}, make_choice([5, 6], [-0.1, -0.2], "ab")],
                      reward=1.0)
    traj.messages_and_choices.append({"role": "user", "content": "more"})
    traj.messages_and_choices.append(ChatCompletionMessage(role="assistant", content="yo"))
    with pytest.raises(InvalidDataError, match="is a ChatCompletionMessage; append the Choice"):
        tokenize_conversation(traj.messages_and_choices, tokenizer)


def test_histories_are_trained_with_the_trajectory_advantage(tokenizer):
    side = History(messages_and_choices=[{"role": "user", "content": "summarise"}, make_choice([8, 9], [-0.2, -0.3])])
    group = TrajectoryGroup([_traj(1.0, histories=[side]), _traj(0.0)])
    batch = tokenize_groups([group], tokenizer, max_seq_len=512)
    assert [(s.trajectory_index, s.history_index) for s in batch.sequences] == [(0, -1), (0, 0), (1, -1)]
    # rewards {1, 0}: advantages {+1, -1} (population std 0.5); the history shares trajectory 0's +1
    assert [round(s.advantage, 5) for s in batch.sequences] == [1.0, 1.0, -1.0]
    assert batch.trainable_tokens == 3 + 2 + 3


def test_not_trainable_reasons(tokenizer):
    plain = Trajectory(messages_and_choices=[{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}], reward=1)
    with pytest.raises(NotTrainableError, match="no Choices with token ids"):
        tokenize_groups([TrajectoryGroup([plain, plain.model_copy(update={"reward": 0.0})])], tokenizer, max_seq_len=512)
    with pytest.raises(NotTrainableError, match="every group has equal rewards"):
        tokenize_groups([TrajectoryGroup([_traj(1.0), _traj(1.0)]), TrajectoryGroup([_traj(0.0)])], tokenizer, max_seq_len=512)
    with pytest.raises(NotTrainableError, match="every sequence is over the length limit"):
        tokenize_groups([TrajectoryGroup([_traj(1.0), _traj(0.0)])], tokenizer, max_seq_len=4)


def test_zero_variance_and_too_long_are_counted(tokenizer):
    groups = [
        TrajectoryGroup([_traj(1.0), _traj(0.0)]),
        TrajectoryGroup([_traj(1.0), _traj(1.0)]),  # zero variance: skipped
        TrajectoryGroup([_traj(1.0, ids=range(5, 600)), _traj(0.0)]),  # first one too long
    ]
    batch = tokenize_groups(groups, tokenizer, max_seq_len=100)
    assert batch.zero_variance_groups == 1 and batch.zero_variance_fraction == pytest.approx(1 / 3)
    assert batch.dropped_too_long == 1
    assert len(batch.sequences) == 3


def _forced_choice(ids, lps, forced):
    choice = make_choice(ids, lps)
    return Choice.model_validate({**choice.model_dump(), "forced_token_indices": forced})


def test_grammar_forced_tokens_are_not_trained_unless_asked(tokenizer):
    eos = tokenizer.eos_token_id
    turn = _ids(tokenizer, '{"name": "f"}') + [eos]
    lps = [-0.1 * (k + 1) for k in range(len(turn))]
    forced = [0, 1, len(turn) - 1]  # e.g. the grammar's opening and, once complete, only EOS
    items = [{"role": "user", "content": "call f"}, _forced_choice(turn, lps, forced)]
    ids, mask, old = tokenize_conversation(items, tokenizer)
    at = next(k for k in range(len(ids)) if ids[k:k + len(turn)] == turn)  # where the turn is spliced
    assert mask[at:at + len(turn)] == [k not in forced for k in range(len(turn))]
    assert not any(mask[:at]) and not any(mask[at + len(turn):])
    assert old[at:at + len(turn)] == lps  # logprobs stay aligned, forced positions included
    ids_all, mask_all, old_all = tokenize_conversation(items, tokenizer, train_forced_tokens=True)
    plain = tokenize_conversation([items[0], make_choice(turn, lps)], tokenizer)
    assert (ids_all, mask_all, old_all) == plain and ids == plain[0] and sum(mask_all) == len(turn)
    with pytest.raises(ValueError, match="forced token index"):
        tokenize_conversation([items[0], _forced_choice(turn, lps, [len(turn)])], tokenizer)


def test_a_sequence_with_every_token_forced_is_dropped(tokenizer):
    def traj(reward, forced):
        return Trajectory(messages_and_choices=[{"role": "user", "content": "q"},
                                                _forced_choice([5, 6, 7], [-1.0] * 3, forced)], reward=reward)

    group = TrajectoryGroup([traj(1.0, [0, 1, 2]), traj(0.0, [1])])
    batch = tokenize_groups([group], tokenizer, max_seq_len=512)
    assert [s.trajectory_index for s in batch.sequences] == [1] and batch.dropped_all_forced == 1
    assert batch.trainable_tokens == 2
    everything = tokenize_groups([group], tokenizer, max_seq_len=512, train_forced_tokens=True)
    assert len(everything.sequences) == 2 and everything.trainable_tokens == 6 and everything.dropped_all_forced == 0
    with pytest.raises(NotTrainableError, match="a grammar forced every sampled token"):
        tokenize_groups([TrajectoryGroup([traj(1.0, [0, 1, 2]), traj(0.0, [0, 1, 2])])], tokenizer, max_seq_len=512)


def test_a_step_tokenises_each_conversation_as_it_would_alone(tokenizer):
    """tokenize_groups renders a context and encodes a text piece once per step (a group's rollouts
    share their scenario's messages): every sequence still equals its conversation tokenised alone,
    with shared contexts, and contexts that differ by one message, by their tools, or by the form of
    a message's content."""
    eos = tokenizer.eos_token_id
    tool = {"type": "function", "function": {"name": "look", "description": "look", "parameters": {"type": "object"}}}
    turns = [_ids(tokenizer, text) + [eos] for text in (" yes", " no", " maybe", " yes")]
    contexts = [
        ([{"role": "user", "content": "a?"}], None),
        ([{"role": "user", "content": "a?"}], None),  # the same context again
        ([{"role": "system", "content": "be brief"}, {"role": "user", "content": "a?"}], None),
        ([{"role": "user", "content": "a?"}], [tool]),  # the same messages, other tools
        ([{"role": "user", "content": [{"type": "text", "text": "a?"}]}], None),  # content as parts
    ]
    groups, alone = [], []
    for g in range(2):
        trajectories = []
        for i, (messages, tools) in enumerate(contexts):
            turn = turns[(g + i) % len(turns)]
            items = [*messages, make_choice(turn, [-0.1 * (k + 1) for k in range(len(turn))], "x")]
            trajectories.append(Trajectory(messages_and_choices=items, tools=tools, reward=float(i)))
            alone.append(tokenize_conversation(items, tokenizer, tools=tools))
        groups.append(TrajectoryGroup(trajectories))
    batch = tokenize_groups(groups, tokenizer, max_seq_len=4096)
    got = [(s.input_ids, s.mask, s.old_logprobs) for s in batch.sequences]
    assert len(got) == len(alone) == 10
    for (ids, mask, old), (ids_a, mask_a, old_a) in zip(got, alone):
        assert (ids, mask) == (ids_a, mask_a)
        assert [x for x, m in zip(old, mask) if m] == [x for x, m in zip(old_a, mask_a) if m]
    assert len({tuple(s.input_ids) for s in batch.sequences}) > 4  # the contexts did differ


def test_sampled_ids_the_model_cannot_embed_are_refused_naming_the_trajectory(tokenizer):
    """A Choice sampled by another model (a larger vocabulary) or edited by the rollout must never reach
    the embedding: on CUDA an id past it is a device-side assert that leaves the GPU unusable for every
    run of the process. The step is refused before the update, naming where the bad data is."""
    from groupwise.errors import InvalidDataError

    vocab = len(tokenizer)

    def group(bad_ids):
        good = Trajectory(messages_and_choices=[{"role": "user", "content": "q"}, make_choice([5, 6], [-1.0] * 2)],
                          reward=1.0)
        bad = Trajectory(messages_and_choices=[{"role": "user", "content": "q"}], reward=0.0, additional_histories=[
            History(messages_and_choices=[{"role": "user", "content": "sub"},
                                          Choice.model_validate({**make_choice([5, 6], [-1.0] * 2).model_dump(),
                                                                 "token_ids": bad_ids})])])
        return [TrajectoryGroup([good, good]), TrajectoryGroup([good, bad])]

    for bad_ids, match in (([5, vocab], rf"token id {vocab}, outside the model's vocabulary \(0 to {vocab - 1}\)"),
                           ([-1, 6], r"token id -1, outside"),
                           ([True, 6], r"token_ids must be a list of ints, got \[True, 6\]"),
                           (["5", 6], r"token_ids must be a list of ints"),
                           ([5.0, 6], r"token_ids must be a list of ints")):
        with pytest.raises(InvalidDataError, match=rf"^group 1, trajectory 1(, additional history 0)?: .*{match}"):
            tokenize_groups(group(bad_ids), tokenizer, max_seq_len=512, vocab_size=vocab)
    # impossible logprobs (the importance ratio is exp(new - old)) are refused the same way; NaN is "unknown"
    def with_logprobs(lps):
        choice = Choice.model_validate({**make_choice([5, 6], [-1.0] * 2).model_dump(), "logprobs": None,
                                        "token_logprobs": lps})
        bad = Trajectory(messages_and_choices=[{"role": "user", "content": "q"}, choice], reward=0.0)
        good = Trajectory(messages_and_choices=[{"role": "user", "content": "q"}, make_choice([5, 6], [-1.0] * 2)],
                          reward=1.0)
        return [TrajectoryGroup([good, bad])]

    for lps, match in (([-0.5, 3.0], r"logprob 3.0: a log-probability is finite and at most 0"),
                       ([-math.inf, -1.0], r"logprob -inf"),
                       ([math.nan, math.inf], r"logprob inf"),
                       (["-1", -1.0], r"token_logprobs must be a list of numbers")):
        with pytest.raises(InvalidDataError, match=rf"^group 0, trajectory 1: .*{match}"):
            tokenize_groups(with_logprobs(lps), tokenizer, max_seq_len=512, vocab_size=vocab)
    batch = tokenize_groups(with_logprobs([math.nan, 0.001]), tokenizer, max_seq_len=512, vocab_size=vocab)
    assert len(batch.sequences) == 2
    # in range: trained, the last id of the vocabulary included
    batch = tokenize_groups(group([5, vocab - 1]), tokenizer, max_seq_len=512, vocab_size=vocab)
    assert any(vocab - 1 in s.input_ids for s in batch.sequences)


def test_a_lone_surrogate_in_context_is_tokenised_as_the_replacement_character(tokenizer):
    """A tool's output decoded with surrogateescape can hold lone surrogates, which the tokenizer refuses
    (a TypeError that failed the whole step). The model never saw such text (its server refuses them),
    so they are context after its last turn: tokenised as U+FFFD, the sampled ids unchanged."""
    turn = [5, 6, tokenizer.eos_token_id]
    items = [{"role": "user", "content": "q"}, make_choice(turn, [-1.0] * 3),
             {"role": "tool", "content": "bytes \udcff\udcfe here", "tool_call_id": "a"}]
    replaced = [*items[:2], {**items[2], "content": "bytes \ufffd\ufffd here"}]
    assert tokenize_conversation(items, tokenizer) == tokenize_conversation(replaced, tokenizer)


def test_context_that_writes_the_trainers_own_marker_is_context(tokenizer):
    """The trainer finds each sampled turn in the rendered text by a marker it writes in its place. A
    context message holding that marker's text (a tool result from a page that carries it, written by
    anyone) was read as a turn: every step holding that trajectory failed, blaming the chat template.
    The marker holds a nonce drawn per process now, so no text can name it in advance."""
    eos = tokenizer.eos_token_id
    turn = _ids(tokenizer, " ok") + [eos]
    poison = "see \u2063GWCHOICE0\u2063 and \u2063GWCHOICE1\u2063"
    items = [{"role": "user", "content": poison}, make_choice(turn, [-0.5] * len(turn), " ok"),
             {"role": "user", "content": poison}]
    ids, mask, _ = tokenize_conversation(items, tokenizer)
    assert [i for i, m in zip(ids, mask) if m] == turn
    rendered = tokenizer.apply_chat_template([{"role": "user", "content": poison},
                                              {"role": "assistant", "content": " ok"},
                                              {"role": "user", "content": poison}], tokenize=False)
    assert tokenizer.decode(ids) == rendered
