"""training: GRPO on LoRA adapters. Never imports inference/ (layer rule); backend/ wires both.
Conversations are rendered by groupwise.chat, the layer the server renders prompts with.

Data flow of one step (each file's docstring says more)::

    list[TrajectoryGroup]
      ──► advantages.py  group-relative advantages; zero-variance groups skipped and counted
      ──► tokenize.py    token-in/token-out sequences: sampled ids + logprobs spliced in, loss mask,
                         NotTrainableError naming why nothing is trainable
      ──► trainer.py     LoRA (peft) + AdamW: token-budget micro-batches, chunked log-probs,
                         gradient accumulation, clipping
            loss.py      the GRPO / DAPO / Dr. GRPO / CISPO loss: one pure function
      ──► checkpoint.py  checkpoints/<step>/: adapter, optimizer, RNG, cursor; state.json last

Importing these modules imports torch; `import groupwise` does not import them.
"""
