"""Supervised fine-tuning (SFT): the masked token NLL of demonstrations, and their tokenisation.

For every target token t of conversation b (mask_bt = 1: a token of an assistant turn), with pi the
policy (LoRA on) and y_b the conversation's tokens:

    L = -(1 / N) sum_bt mask_bt log pi(y_bt | y_b,<t),        N = sum_bt mask_bt

N counts the target tokens of the whole update (every micro-batch), so the sum of the micro-batch
losses is exactly the full-batch loss, as in the GRPO loss (training/loss.py).

Targets are assistant turns only (system, user and tool messages are context), token-in/token-out:
- an assistant turn that is a `Choice` with sampled token ids is trained on those ids, spliced in
  as the GRPO tokeniser does (training/tokenize.py);
- any other assistant turn (a plain ``{"role": "assistant", ...}`` dict, e.g. a scripted
  demonstration, or a Choice without ids) is rendered by the chat layer the server renders prompts with
  (`groupwise.chat`: tool calls written as the model writes them):
  its tokens are what the template adds for that message, up to and including the end-of-turn
  token, so the model also learns to stop.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from groupwise.chat import render_text
from groupwise.core.choices import choice_to_message, choice_token_ids
from groupwise.config import DEFAULT_ASSISTANT_TURNS
from groupwise.errors import ArgumentTypeError, InvalidDataError, NotTrainableError
from groupwise.training.tokenize import (
    TokenizedBatch,
    TokenizedSequence,
    data_of,
    tokenize_conversation,
)
from groupwise.core.trajectory import Choice, Trajectory

__all__ = ["SFTLossTerms", "sft_loss", "sft_sequence", "tokenize_sft"]


@dataclass
class SFTLossTerms:
    """The loss of a micro-batch and detached sums (so micro-batches add up)."""

    loss: torch.Tensor  # scalar with gradient, already divided by the update's N
    nll_sum: torch.Tensor  # sum_bt mask_bt * -log pi(y_bt), detached
    tokens: torch.Tensor  # target tokens in the micro-batch


def sft_loss(logprobs_BT: torch.Tensor, mask_BT: torch.Tensor, *, num_tokens: int) -> SFTLossTerms:
    """Masked token NLL of a micro-batch (the module docstring's equation).

    logprobs_BT: log pi(y_bt) under the policy, with gradient; any value off the mask.    # [B, T]
    mask_BT:     1 where y_bt is a target (assistant) token, else 0.                      # [B, T]
    num_tokens:  N, the target tokens of the whole update.
    """
    on_BT = mask_BT > 0
    # Off-mask positions may hold anything (even NaN): zero them before they meet the sum.
    logprobs_BT = torch.where(on_BT, logprobs_BT, torch.zeros_like(logprobs_BT))
    nll_sum = -(logprobs_BT * on_BT.to(logprobs_BT.dtype)).sum()
    return SFTLossTerms(loss=nll_sum / max(num_tokens, 1), nll_sum=nll_sum.detach(),
                        tokens=on_BT.sum().detach())


def _special_ids(tokenizer: Any) -> set[int]:
    """Ids that may end a turn: the named special tokens, and every added token marked special.

    The added ones matter: transformers 5.17 builds SmolLM2's GGUF tokenizer with ``<|im_start|>`` as eos
    and leaves ``<|im_end|>`` out of the named tokens, though it is still an added special token.
    """
    ids = set(getattr(tokenizer, "all_special_ids", []) or [])
    if getattr(tokenizer, "eos_token_id", None) is not None:
        ids.add(tokenizer.eos_token_id)
    added = getattr(tokenizer, "added_tokens_decoder", None) or {}
    ids.update(i for i, token in added.items() if getattr(token, "special", False))
    return ids


def rendered_turn_ids(messages: list[dict], index: int, tokenizer: Any, *,
                      tools: list[dict] | None = None) -> list[int]:
    """The token ids the chat template writes for assistant message `index`, end-of-turn token included.

    Found as the difference between the conversation rendered up to the message (with the generation
    prompt, as the server renders a request) and rendered with it: exactly what a model answering
    that request would have to write.
    """
    before = render_text(tokenizer, messages[:index], tools, add_generation_prompt=True)
    full = render_text(tokenizer, messages[: index + 1], tools)
    if not full.startswith(before):
        raise InvalidDataError(
            f"the chat template renders the conversation before assistant message {index} differently once that "
            "message is added, so its tokens cannot be told apart (some templates rewrite earlier turns). "
            "Train on Choices with sampled token ids instead, or use a template that only appends turns."
        )
    ids = tokenizer(full[len(before):], add_special_tokens=False)["input_ids"]
    special = _special_ids(tokenizer)
    ends = [k for k, t in enumerate(ids) if t in special]
    if not ends:
        raise InvalidDataError(
            f"the chat template writes no end-of-turn special token after assistant message {index}, so the "
            "model could not learn where its turn ends; use an instruct model's tokenizer and template."
        )
    return ids[: ends[-1] + 1]  # what follows the end-of-turn token is the template's separator: context


def _as_target(ids: list[int]) -> Choice:
    # A demonstration turn becomes a Choice carrying the ids the server would have sampled for it,
    # so tokenize_conversation splices it exactly like a sampled turn.
    return Choice.model_validate({"index": 0, "finish_reason": "stop", "token_ids": ids,
                                  "message": {"role": "assistant", "content": None}})


def sft_sequence(
    messages_and_choices: Sequence[Any],
    tokenizer: Any,
    *,
    tools: list[dict] | None = None,
    assistant_turns: str = DEFAULT_ASSISTANT_TURNS,
    vocab_size: int | None = None,
) -> tuple[list[int], list[bool]] | None:
    """(input_ids [T], mask [T]) of one conversation, the mask on its assistant turns; None without any."""
    items = list(messages_and_choices)
    messages = [choice_to_message(m) if isinstance(m, Choice) else m for m in items]
    assistant = [k for k, m in enumerate(messages) if m.get("role") == "assistant"]
    if not assistant:
        return None
    targets = set(assistant if assistant_turns == "all" else assistant[-1:])
    prepared: list[Any] = []
    for k, (item, message) in enumerate(zip(items, messages)):
        if k not in targets:
            prepared.append(message)  # context, rendered as text (a sampled Choice too)
        elif isinstance(item, Choice) and choice_token_ids(item):
            prepared.append(item)  # token-in/token-out: the sampled ids
        else:
            prepared.append(_as_target(rendered_turn_ids(messages, k, tokenizer, tools=tools)))
    # Imitation trains every token of a target turn, grammar-forced ones too: the model learns the format.
    ids, mask, _ = tokenize_conversation(prepared, tokenizer, tools=tools, train_forced_tokens=True,
                                         vocab_size=vocab_size)
    return ids, mask


def tokenize_sft(
    trajectories: Sequence[Trajectory],
    tokenizer: Any,
    *,
    max_seq_len: int,
    assistant_turns: str = DEFAULT_ASSISTANT_TURNS,
    vocab_size: int | None = None,
) -> TokenizedBatch:
    """The target sequences of one update: each trajectory and each of its additional histories.

    Raises `NotTrainableError` saying why when nothing is left to train on, and `InvalidDataError`
    naming the trajectory whose data cannot be trained (a sampled id past `vocab_size`, say).
    """
    batch = TokenizedBatch(num_groups=1)
    without = 0
    for i, traj in enumerate(trajectories):
        if not isinstance(traj, Trajectory):
            raise ArgumentTypeError(f"trajectories[{i}] is {type(traj).__name__}; train_sft takes gw.Trajectory "
                                    "objects")
        convs = [(-1, traj.messages_and_choices, traj.tools)]
        convs += [(h, hist.messages_and_choices, hist.tools) for h, hist in enumerate(traj.additional_histories)]
        found = False
        for h, items, tools in convs:
            with data_of(f"trajectory {i}" + (f", additional history {h}" if h >= 0 else "")):
                seq = sft_sequence(items, tokenizer, tools=tools, assistant_turns=assistant_turns,
                                   vocab_size=vocab_size)
            if seq is None:
                continue
            found = True
            ids, mask = seq
            if len(ids) > max_seq_len:
                batch.dropped_too_long += 1
                continue
            batch.sequences.append(TokenizedSequence(ids, mask, [float("nan")] * len(ids), 1.0, 0, i, h))
        without += not found
    batch.trajectories_without_token_ids = without  # here: trajectories without an assistant turn
    if not batch.sequences:
        why = (f"{batch.dropped_too_long} conversation(s) are longer than max_seq_len={max_seq_len} tokens; raise "
               "TrainSFTConfig.max_seq_len" if batch.dropped_too_long else
               "no assistant turn in any of them; a demonstration needs {'role': 'assistant', ...} turns or Choices")
        raise NotTrainableError(f"nothing to train on in {len(trajectories)} trajectories: {why}.")
    return batch
