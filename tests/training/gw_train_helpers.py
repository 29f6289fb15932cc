"""Helpers of the training tests (imported by name: pytest puts this folder on sys.path)."""

from __future__ import annotations

from openai.types.chat.chat_completion import ChatCompletionMessage, Choice, ChoiceLogprobs
from openai.types.chat.chat_completion_token_logprob import ChatCompletionTokenLogprob


def lora_model(tokenizer, *, dtype=None, seed: int = 0, dropout: float = 0.0):
    """A tiny random Llama (fp64 by default) wrapped with a rank-4 LoRA whose B is random: peft starts B
    at 0, which makes dL/dA = 0; a random B makes every LoRA gradient non-trivial."""
    import torch

    from groupwise.config import LoraConfig
    from groupwise.runtime.loading import tiny_random_model
    from groupwise.training.adapters import wrap_with_lora

    model, _ = tiny_random_model(seed=seed, tokenizer=tokenizer, dtype=dtype or torch.float64)
    peft_model = wrap_with_lora(model, LoraConfig(rank=4, alpha=8, dropout=dropout))
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for n, p in peft_model.named_parameters():
            if "lora_B" in n:
                p.copy_(torch.randn(p.shape, generator=gen, dtype=p.dtype) * 0.05)
    return peft_model


def random_batch(lengths=(20, 18, 16, 14), vocab: int = 1000, seed: int = 2):
    """A step's batch of random token ids (one group): each sequence's second half sampled, with old logprobs
    -3.0 - 0.1 * position there, and advantages 1, -1, 0.5, -0.5 in turn."""
    import math

    import torch

    from groupwise.training.tokenize import TokenizedBatch, TokenizedSequence

    gen = torch.Generator().manual_seed(seed)
    seqs = []
    for b, n in enumerate(lengths):
        ids = torch.randint(3, vocab, (n,), generator=gen).tolist()
        mask = [t >= n // 2 for t in range(n)]  # second half sampled
        old = [(-3.0 - 0.1 * t) if m else math.nan for t, m in enumerate(mask)]
        seqs.append(TokenizedSequence(ids, mask, old, advantage=[1.0, -1.0, 0.5, -0.5][b % 4], trajectory_index=b))
    return TokenizedBatch(sequences=seqs, num_groups=1)


def make_choice(token_ids: list[int], logprobs: list[float] | None, text: str = "x") -> Choice:
    """A Choice as groupwise's server returns it: token ids in the extra field, logprobs per token."""
    lp = None
    if logprobs is not None:
        lp = ChoiceLogprobs(
            content=[
                ChatCompletionTokenLogprob(token=f"t{t}", logprob=l, bytes=None, top_logprobs=[])
                for t, l in zip(token_ids, logprobs)
            ]
        )
    return Choice(
        index=0,
        finish_reason="stop",
        message=ChatCompletionMessage(role="assistant", content=text),
        logprobs=lp,
        token_ids=list(token_ids),
    )


def sample_choices(model, tokenizer, messages, n: int, max_new_tokens: int, *, temperature: float = 1.0, top_k: int = 0):
    """Sample n Choices from an HF model directly (no engine): token ids and their logprobs attached.

    Test-only stand-in for the inference server, so the trainer is tested without inference/. The
    logprobs are the policy's own (raw logits / temperature), also when top_k narrows the sampling.
    """
    import torch

    prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    ids = prompt["input_ids"].repeat(n, 1)
    with torch.no_grad():
        out = model.generate(
            input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=True, temperature=temperature,
            top_k=top_k or None, top_p=1.0, max_new_tokens=max_new_tokens, min_new_tokens=max_new_tokens,
            output_logits=True, return_dict_in_generate=True, pad_token_id=tokenizer.pad_token_id,
        )
    new = out.sequences[:, ids.shape[1]:]
    logprobs = torch.stack(out.logits, dim=1).float().div(temperature).log_softmax(-1)
    token_lp = logprobs.gather(-1, new[..., None]).squeeze(-1)
    return [make_choice(new[i].tolist(), token_lp[i].tolist(), tokenizer.decode(new[i])) for i in range(n)]
