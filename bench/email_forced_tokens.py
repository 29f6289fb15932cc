"""How many tokens of the email agent's tool calls the server's tool-call grammar forces.

Under ``tool_choice="required"`` the server decodes each reply under a grammar (inference/constrained.py)
and reports the unconstrained policy's log-probs, which the trainer trains on. A token the grammar
forces (the only one it allows) was no decision of the policy, yet GRPO weights its log-prob by the
trajectory's advantage. This counts them: the scripted agent's calls (search, read, answer) on the
training questions, tokenized as the model would write them, stepped through a fresh matcher of the
grammar the env's requests ask for; at each position, how many tokens the grammar allows.

Run:  python bench/email_forced_tokens.py [--questions 64]
"""

from __future__ import annotations

import argparse

from groupwise.envs import get_env
from groupwise.envs.email_search import tools as T
from groupwise.envs.email_search.scripted import demonstration
from groupwise.inference.constrained import allowed_mask, constraint_for
from groupwise.inference.tool_calls import format_tool_call
from groupwise.runtime.loading import load_tokenizer


def main(args: argparse.Namespace) -> None:
    tokenizer = load_tokenizer(args.model)
    spec = get_env("email")
    train = spec.scenarios(0, tool_mode="native")[0][: args.questions]
    constraint = constraint_for(tokenizer, tools=T.TOOLS, tool_choice="required")
    vocab = len(tokenizer)
    by_tool: dict[str, list[int]] = {}  # tool -> [tokens, forced]
    for scenario in train:
        for message in demonstration(scenario).messages_and_choices:
            if not isinstance(message, dict) or message.get("role") != "assistant":
                continue
            call = message["tool_calls"][0]
            text = format_tool_call(call["function"]["name"], call["function"]["arguments"])  # as SFT renders it
            ids = tokenizer(text, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
            matcher = constraint.new_matcher()
            counts = by_tool.setdefault(call["function"]["name"], [0, 0])
            for token in ids:
                allowed = int(allowed_mask([matcher], vocab, "cpu")[0].sum())
                if not matcher.consume_token(token):
                    raise SystemExit(f"the grammar rejects token {token} ({tokenizer.decode([token])!r}) of "
                                     f"{text!r}: the rendering here no longer matches the grammar")
                counts[0] += 1
                counts[1] += allowed == 1
    print(f"{len(train)} scripted episodes, SmolLM2 tokenizer, tool_choice='required' grammar\n")
    print("| tool | tokens per call | forced by the grammar |")
    print("|---|---|---|")
    total = [0, 0]
    for name, (n, forced) in by_tool.items():
        print(f"| {name} | {n / len(train):.1f} | {forced / n:.0%} |")
        total = [total[0] + n, total[1] + forced]
    print(f"| all calls | {total[0] / len(train):.1f} per episode | {total[1] / total[0]:.0%} |")


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--questions", type=int, default=64)
    main(p.parse_args())
