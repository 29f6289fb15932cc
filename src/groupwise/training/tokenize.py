"""TrajectoryGroups become token sequences for the trainer (token-in/token-out).

Every assistant turn that is a `Choice` with token ids keeps its EXACT sampled ids and logprobs
(`choices.choice_token_ids` / `choice_logprobs`): the text is never re-tokenised, so what the trainer
scores is what the sampler produced. Everything else (system, user, tool messages, plain assistant
dicts, Choices without token ids) is context, rendered with the tokenizer's chat template.

How: the conversation is rendered once by the chat layer (`groupwise.chat.render_text`, the rendering
the server renders every prompt with: tool calls written as the model writes them, tools in the system
prompt for a template without tool support), each trainable Choice replaced by a sentinel string; the rendered text is split at the sentinels, the text pieces are tokenised, and the
sampled ids are spliced in where the sentinels were. When a Choice's last sampled token is a special
token (the end-of-turn token, e.g. ``<|im_end|>``) that the template also writes after the content,
the template's copy is dropped so it is not doubled, and the sampled one is trained (the model learns
to stop).

A step renders each distinct context and encodes each distinct text piece once (`StepMemo`): a group's
rollouts usually share their scenario's messages.

A text completion (``/v1/completions``) has no messages to render: its Choice carries the token ids of
its prompt (``prompt_token_ids``), and a conversation of such Choices is its ids alone: each Choice's
prompt ids (the part past what the conversation already holds: a continuation's prompt starts with the
earlier prompt and sampled ids) as context, then its sampled ids. Its message dicts are for reading
only (the prompt's text).

One sequence per trajectory plus one per `additional_histories` entry; all carry the trajectory's
advantage. The loss mask covers every trainable Choice of every turn, except the tokens a grammar
forced (`choices.choice_forced_indices`: the only token it allowed, so the sampling distribution there
is a point mass and carries no decision of the policy; training them with the trajectory's advantage
is noise) unless `train_forced_tokens`. Their old logprobs stay in place. A sequence left with no
trainable token is dropped, like a conversation without token ids.
"""

from __future__ import annotations

import math
import re
import secrets
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from groupwise.chat import render_text
from groupwise.chat.text import LONE_SURROGATE
from groupwise.core.choices import (choice_forced_indices, choice_logprobs, choice_prompt_token_ids, choice_to_message,
                                    choice_token_ids)
from groupwise.errors import InvalidDataError, NotTrainableError
from groupwise.core.advantages import compute_advantages
from groupwise.core.trajectory import Choice, TrajectoryGroup, item_kind_problem

# Where each sampled turn goes in the rendered text. A chat template never writes it, and the nonce (drawn
# per process) keeps any message's text from writing it: a tool result holding a fixed marker was read as
# a turn, and every step holding that trajectory failed.
_NONCE = secrets.token_hex(8)
_SENTINEL = f"\u2063GW{_NONCE}CHOICE{{}}\u2063"
_SENTINEL_RE = re.compile(f"\u2063GW{_NONCE}CHOICE(\\d+)\u2063")


@dataclass
class TokenizedSequence:
    """One conversation as tokens. Position t holds token t; `mask[t]` says token t was sampled."""

    input_ids: list[int]  # [T]
    mask: list[bool]  # [T] True at tokens the policy sampled (trained), False at context
    old_logprobs: list[float]  # [T] sampler's logprob of token t; NaN at context or when not returned
    advantage: float
    group_index: int = 0
    trajectory_index: int = 0
    history_index: int = -1  # -1: the trajectory's own messages; i: additional_histories[i]

    def __len__(self) -> int:
        return len(self.input_ids)

    @property
    def num_trainable(self) -> int:
        return sum(self.mask)


@dataclass
class TokenizedBatch:
    """The trainable sequences of one step, and counts the metrics report."""

    sequences: list[TokenizedSequence] = field(default_factory=list)
    num_groups: int = 0
    zero_variance_groups: int = 0
    dropped_too_long: int = 0
    trajectories_without_token_ids: int = 0
    dropped_all_forced: int = 0  # sequences whose every sampled token a grammar forced
    forced_tokens: int = 0  # grammar-forced tokens of the kept sequences, left out of the loss

    @property
    def trainable_tokens(self) -> int:
        return sum(s.num_trainable for s in self.sequences)

    @property
    def zero_variance_fraction(self) -> float:
        return self.zero_variance_groups / self.num_groups if self.num_groups else 0.0


def _special_ids(tokenizer: Any) -> set[int]:
    ids = set(getattr(tokenizer, "all_special_ids", []) or [])
    if getattr(tokenizer, "eos_token_id", None) is not None:
        ids.add(tokenizer.eos_token_id)
    return ids


# How far above 0 a sampled token's logprob may be: a sampler's log-softmax in low precision can round
# a near-certain token's logprob a little past 0, never by this much.
LOGPROB_SLACK = 1e-2


@contextmanager
def data_of(where: str) -> Iterator[None]:
    """Put `where` (the group, trajectory and history) in front of an `InvalidDataError` the block raises:
    the conversation's own message cannot say which of a step's rollouts it is."""
    try:
        yield
    except InvalidDataError as exc:
        raise InvalidDataError(f"{where}: {exc}") from exc


def _has_token_ids(items: Sequence[Any]) -> bool:
    return any(isinstance(m, Choice) and choice_token_ids(m) for m in items)


_PLAIN = (str, int, float, bool, type(None))


def _plain_key(value: Any) -> str | None:
    """A key that tells `value` apart from any other plain value (the repr of dicts, lists, strings and
    numbers, subclasses excluded, is faithful), or None when it holds anything else (an object's repr
    may not show its state)."""
    stack = [value]
    while stack:
        v = stack.pop()
        if type(v) is dict:
            stack.extend(v.keys())
            stack.extend(v.values())
        elif type(v) in (list, tuple):
            stack.extend(v)
        elif type(v) not in _PLAIN:
            return None
    return repr(value)


def _encodable(text: str) -> str:
    """`text` with each lone surrogate (a tool's output decoded with surrogateescape, say) as U+FFFD: the
    tokenizer refuses them. No such text reached the model: its server refuses them in a request, so
    they stand only in context the model never saw (after its last turn), and trained ids are unchanged."""
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        return LONE_SURROGATE.sub("\ufffd", text)


@dataclass
class StepMemo:
    """What repeats across one step's conversations, computed once: a group's rollouts usually share
    their context (the same scenario's messages), so the same text is rendered and the same pieces are
    encoded up to eight times a group. Only pure functions of their arguments are kept (a chat
    template's text for the same messages and tools, the tokenizer's ids for the same text), so a
    memoised step tokenises exactly as an unmemoised one."""

    rendered: dict[str, str] = field(default_factory=dict)
    encoded: dict[str, list[int]] = field(default_factory=dict)
    special: set[int] | None = None

    def render(self, tokenizer: Any, messages: list[Any], tools: list[dict] | None) -> str:
        key = _plain_key((messages, tools))
        if key is None:
            return render_text(tokenizer, messages, tools)
        if key not in self.rendered:
            self.rendered[key] = render_text(tokenizer, messages, tools)
        return self.rendered[key]

    def encode(self, tokenizer: Any, text: str) -> list[int]:
        if text not in self.encoded:
            self.encoded[text] = list(tokenizer(_encodable(text), add_special_tokens=False)["input_ids"])
        return self.encoded[text]

    def special_ids(self, tokenizer: Any) -> set[int]:
        if self.special is None:
            self.special = _special_ids(tokenizer)
        return self.special


def tokenize_conversation(
    messages_and_choices: Sequence[Any],
    tokenizer: Any,
    *,
    tools: list[dict] | None = None,
    train_forced_tokens: bool = False,
    memo: StepMemo | None = None,
    vocab_size: int | None = None,
) -> tuple[list[int], list[bool], list[float]]:
    """(input_ids [T], mask [T], old_logprobs [T]) of one conversation; see the module docstring.
    The mask is False at grammar-forced tokens unless `train_forced_tokens`. `memo` shares rendering
    and encoding across the conversations of one step (`tokenize_groups`). A sampled id outside
    ``[0, vocab_size)`` is refused here: in the embedding lookup it would be an IndexError on the CPU
    and a device-side assert on CUDA, which leaves the GPU unusable for every run the process holds."""
    memo = memo if memo is not None else StepMemo()
    if any(isinstance(item, Choice) and choice_prompt_token_ids(item) is not None for item in messages_and_choices):
        return _tokenize_completions(messages_and_choices, train_forced_tokens=train_forced_tokens,
                                     vocab_size=vocab_size)
    if not getattr(tokenizer, "chat_template", None):
        raise InvalidDataError(
            "the tokenizer has no chat_template, so the context messages cannot be rendered. "
            "Set tokenizer.chat_template (a Jinja string) or use an instruct model's tokenizer."
        )
    messages: list[dict] = []
    spliced: list[tuple[list[int], list[float], list[bool]]] = []
    for item in messages_and_choices:
        if isinstance(item, Choice):
            ids = choice_token_ids(item)
            if not ids:
                messages.append(choice_to_message(item))  # no ids: context, rendered as text
                continue
            logprobs, trained = _sampled(item, ids, vocab_size, train_forced_tokens)
            messages.append({"role": "assistant", "content": _SENTINEL.format(len(spliced))})
            spliced.append((ids, logprobs, trained))
        else:
            # `traj.messages_and_choices.append(x)` skips the Trajectory's validation: an x that is no
            # message (say choice.message) would render as context and silently never train
            problem = item_kind_problem(item)
            if problem:
                raise InvalidDataError(f"an item of messages_and_choices {problem}")
            messages.append(item)
    text = memo.render(tokenizer, messages, tools)
    pieces = _SENTINEL_RE.split(text)  # text, k, text, k, ..., text
    found = [int(k) for k in pieces[1::2]]
    if found != list(range(len(spliced))):
        raise InvalidDataError(
            f"the chat template rendered trained assistant turns {found}, expected {list(range(len(spliced)))}: "
            "it drops or reorders assistant messages (some templates drop earlier turns' reasoning). "
            "Use a template that renders every assistant turn, or train on the last turn only."
        )
    special = memo.special_ids(tokenizer)
    input_ids: list[int] = []
    mask: list[bool] = []
    old: list[float] = []
    for i, piece in enumerate(pieces[0::2]):
        if i > 0:
            ids, logprobs, trained = spliced[i - 1]
            last = ids[-1]
            if last in special:
                # The sampled end-of-turn token is trained; the template's copy of it is dropped.
                tok_text = tokenizer.convert_ids_to_tokens(last)
                if isinstance(tok_text, str) and piece.startswith(tok_text):
                    piece = piece[len(tok_text):]
            input_ids += ids
            mask += trained
            old += map(float, logprobs)
        if piece:
            ids_ctx = memo.encode(tokenizer, piece)
            input_ids += ids_ctx
            mask += [False] * len(ids_ctx)
            old += [math.nan] * len(ids_ctx)
    return input_ids, mask, old


def _sampled(choice: Choice, ids: list[int], vocab_size: int | None,
             train_forced_tokens: bool) -> tuple[list[float], list[bool]]:
    """(old logprobs, trained flags) of a Choice's sampled `ids`, its data checked."""
    if vocab_size is not None and ids and (min(ids) < 0 or max(ids) >= vocab_size):
        bad = next(t for t in ids if not 0 <= t < vocab_size)
        raise InvalidDataError(
            f"a Choice has the token id {bad}, outside the model's vocabulary (0 to {vocab_size - 1}): it was "
            "sampled by another model (a server of another base, a tokenizer with other ids), or its ids "
            "were edited. Sample the rollouts from this model's endpoint (model.openai_client()).")
    logprobs = choice_logprobs(choice)
    # a NaN fails both comparisons and is kept out after: NaN marks a logprob as unknown
    outside = [x for x in logprobs or () if not -math.inf < x <= LOGPROB_SLACK]
    impossible = next((x for x in outside if not math.isnan(x)), None)
    if impossible is not None:
        raise InvalidDataError(
            f"a Choice has the sampled-token logprob {impossible}: a log-probability is finite and at most "
            "0, and the trainer's importance ratio is exp(its own logprob - this one). The server that "
            "sampled it returned an impossible value, or it was edited; sample from this model's endpoint "
            "(NaN marks a logprob as unknown: the trainer then takes its own).")
    if logprobs is not None and len(logprobs) != len(ids):
        raise InvalidDataError(
            f"a Choice has {len(ids)} token ids but {len(logprobs)} logprobs; they must pair up "
            "one to one. The server that sampled it returned inconsistent data."
        )
    trained = [True] * len(ids)
    for k in ([] if train_forced_tokens else choice_forced_indices(choice)):
        if not 0 <= k < len(ids):
            raise InvalidDataError(f"a Choice has {len(ids)} token ids but a forced token index {k}; the "
                                   "server that sampled it returned inconsistent data.")
        trained[k] = False
    return (logprobs if logprobs is not None else [math.nan] * len(ids)), trained


def _tokenize_completions(items: Sequence[Any], *, train_forced_tokens: bool,
                          vocab_size: int | None) -> tuple[list[int], list[bool], list[float]]:
    """A conversation of text completions as its token ids alone (module doc)."""
    input_ids: list[int] = []
    mask: list[bool] = []
    old: list[float] = []
    for item in items:
        if not isinstance(item, Choice):
            continue  # the prompt's text, for reading
        prompt = choice_prompt_token_ids(item)
        ids = choice_token_ids(item)
        if prompt is None or not ids:
            raise InvalidDataError(
                "a conversation of text completions holds a Choice without prompt_token_ids or token_ids: every "
                "turn of it must be a completion as the server returned it (its prompt's ids and its sampled ids)")
        if prompt[:len(input_ids)] != input_ids:
            raise InvalidDataError(
                f"a text completion's prompt ({len(prompt)} token ids) does not start with the {len(input_ids)} "
                "ids of the completions before it in its conversation, so it does not continue them; keep each "
                "completion that starts afresh as its own history")
        context = prompt[len(input_ids):]
        if vocab_size is not None and not all(0 <= t < vocab_size for t in context):
            raise InvalidDataError(f"a text completion's prompt_token_ids hold ids outside the model's vocabulary "
                                   f"(0 to {vocab_size - 1}): it was sampled by another model")
        logprobs, trained = _sampled(item, ids, vocab_size, train_forced_tokens)
        input_ids += context + ids
        mask += [False] * len(context) + trained
        old += [math.nan] * len(context) + [float(x) for x in logprobs]
    return input_ids, mask, old


def tokenize_groups(
    groups: Sequence[TrajectoryGroup],
    tokenizer: Any,
    *,
    max_seq_len: int,
    scale_rewards: bool = True,
    train_forced_tokens: bool = False,
    vocab_size: int | None = None,
    keep_tied_groups: bool = False,
) -> TokenizedBatch:
    """The trainable sequences of a step. Raises `NotTrainableError` naming why nothing is trainable,
    and `InvalidDataError` naming the group and trajectory whose data cannot be trained.
    `keep_tied_groups`: a group whose rewards tie is trained with advantage 0 instead of dropped (a
    distillation teacher gives its tokens a signal of their own: TrainConfig.teacher)."""
    groups = list(groups)
    trajectories = [t for g in groups for t in g.trajectories]
    with_ids = []
    for g, group in enumerate(groups):
        for i, t in enumerate(group.trajectories):
            with data_of(f"group {g}, trajectory {i}"):
                if _has_token_ids(t.messages_and_choices) or any(_has_token_ids(h.messages_and_choices)
                                                                 for h in t.additional_histories):
                    with_ids.append(t)
    batch = TokenizedBatch(num_groups=len(groups), trajectories_without_token_ids=len(trajectories) - len(with_ids))
    if not with_ids:
        raise NotTrainableError(
            f"nothing to train on: no Choices with token ids in {len(trajectories)} trajectories of {len(groups)} "
            "group(s). Only assistant turns that are `Choice`s carrying sampled token ids are trained; plain "
            "assistant dicts are context. Append the Choice the model returned (`choice`, not "
            "`choice.message`), and sample from groupwise's server (it returns token ids) or vLLM with "
            "return_tokens_as_token_ids and logprobs."
        )
    adv = compute_advantages([g.rewards() for g in groups], scale=scale_rewards)
    batch.zero_variance_groups = adv.zero_variance_groups
    if keep_tied_groups:
        adv.advantages = [a if a is not None else [0.0] * len(g.trajectories) for a, g in zip(adv.advantages, groups)]
    elif adv.zero_variance_groups == len(groups):
        raise NotTrainableError(
            f"nothing to train on: every group has equal rewards ({len(groups)} group(s), e.g. rewards "
            f"{groups[0].rewards()[:8]}), so every group-relative advantage is 0. Make rewards differ within "
            "a group: more rollouts per group, a graded reward instead of pass/fail, harder or easier scenarios, "
            "or a judge (RULER)."
        )
    over_limit = 0
    memo = StepMemo()
    for g, (group, adv_G) in enumerate(zip(groups, adv.advantages)):
        if adv_G is None:
            continue
        for i, (traj, a) in enumerate(zip(group.trajectories, adv_G)):
            convs = [(-1, traj.messages_and_choices, traj.tools)]
            convs += [(h, hist.messages_and_choices, hist.tools) for h, hist in enumerate(traj.additional_histories)]
            for h, items, tools in convs:
                if not _has_token_ids(items):
                    continue
                with data_of(f"group {g}, trajectory {i}" + (f", additional history {h}" if h >= 0 else "")):
                    ids, mask, old = tokenize_conversation(items, tokenizer, tools=tools, vocab_size=vocab_size,
                                                           train_forced_tokens=train_forced_tokens, memo=memo)
                if not any(mask):
                    batch.dropped_all_forced += 1
                    continue
                if len(ids) > max_seq_len:
                    over_limit += 1
                    continue
                batch.sequences.append(TokenizedSequence(ids, mask, old, a, g, i, h))
                if not train_forced_tokens:
                    batch.forced_tokens += sum(len(choice_forced_indices(c)) for c in items if isinstance(c, Choice))
    batch.dropped_too_long = over_limit
    if not batch.sequences and not over_limit:
        raise NotTrainableError(
            f"nothing to train on: a grammar forced every sampled token of all {batch.dropped_all_forced} "
            "sequence(s) (tool_choice / response_format allowed one token at each), so the policy decided "
            "nothing. Set TrainConfig.train_forced_tokens=True to train them anyway, or loosen the constraint."
        )
    if not batch.sequences:
        raise NotTrainableError(
            f"nothing to train on: every sequence is over the length limit ({over_limit} sequence(s) longer "
            f"than max_seq_len={max_seq_len} tokens). Raise TrainConfig.max_seq_len or cap max_tokens / the "
            "number of turns in the rollout."
        )
    return batch
