"""A distillation teacher on another base model (TrainConfig.teacher naming a model, not an adapter).

The teacher scores the token ids the student sampled, so both must read those ids as the same tokens: the
same tokenizer vocabulary (every token at the same id, special tokens included) and LM heads that cover
every id of it. Architecture, size, depth and hidden width may differ: a bigger model of the student's
family (SmolLM2-360M for SmolLM2-135M, Qwen3-8B for Qwen3-0.6B) qualifies. The chat template does not
matter: the teacher sees the student's exact token sequence, not a re-rendered conversation.

The teacher is loaded once per process beside the student, on its device, in eval mode with every
parameter frozen, and only ever runs under no_grad: inference memory only (its weights and one micro-
batch's activations), no gradients, no optimizer state, no adapter.
"""

from __future__ import annotations

from typing import Any

from groupwise.errors import TeacherMismatchError

__all__ = ["load_teacher", "vocabulary_problems"]


def _head_rows(model: Any) -> int:
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return int(base.get_output_embeddings().weight.shape[0])


def vocabulary_problems(student_tokenizer: Any, teacher_tokenizer: Any, *, student_head_rows: int,
                        teacher_head_rows: int) -> list[str]:
    """Why a teacher cannot score a student's tokens; [] when it can (module docstring)."""
    problems: list[str] = []
    student_vocab, teacher_vocab = student_tokenizer.get_vocab(), teacher_tokenizer.get_vocab()
    if student_vocab != teacher_vocab:
        by_id_s = {i: t for t, i in student_vocab.items()}
        by_id_t = {i: t for t, i in teacher_vocab.items()}
        differing = sorted(i for i in by_id_s.keys() | by_id_t.keys() if by_id_s.get(i) != by_id_t.get(i))
        examples = ", ".join(f"id {i}: {by_id_s.get(i)!r} vs {by_id_t.get(i)!r}" for i in differing[:3])
        problems.append(f"its tokenizer vocabulary differs: {len(student_vocab)} tokens for the student, "
                        f"{len(teacher_vocab)} for the teacher, {len(differing)} id(s) read differently ({examples})")
    needed = max(student_vocab.values(), default=-1) + 1
    for who, rows in (("the student's", student_head_rows), ("the teacher's", teacher_head_rows)):
        if rows < needed:
            problems.append(f"{who} LM head scores {rows} ids, fewer than the {needed} of the tokenizer")
    return problems


def load_teacher(source: str, *, student_model: Any, student_tokenizer: Any, device: Any, dtype: Any,
                 load_model: Any = None) -> Any:
    """The causal LM `source` (a short name, a model folder or a Hugging Face id) as a frozen teacher of a
    student: on `device` in `dtype`, eval mode, no parameter requiring a gradient. `load_model` is
    ``(source, device=, dtype=) -> (model, tokenizer)`` (default: runtime.loading's `load_base_model`).
    Raises TeacherMismatchError when its vocabulary is not the student's (`vocabulary_problems`)."""
    from groupwise.runtime.loading import load_base_model

    model, tokenizer = (load_model or load_base_model)(source, device=device, dtype=dtype)
    problems = vocabulary_problems(student_tokenizer, tokenizer, student_head_rows=_head_rows(student_model),
                                   teacher_head_rows=_head_rows(model))
    if problems:
        raise TeacherMismatchError(
            f"TrainConfig.teacher={source!r} cannot teach this student: {'; '.join(problems)}. A teacher on another "
            "base model scores the token ids the student samples, so it needs the student's tokenizer vocabulary "
            "(every token at the same id, special tokens included) and an LM head covering it: a model of the same "
            "family (e.g. a bigger SmolLM2 for a SmolLM2 student). Its architecture and size may differ. For a "
            "teacher of another vocabulary, distil offline instead (SFT on its outputs).")
    model.eval()
    model.requires_grad_(False)
    return model
