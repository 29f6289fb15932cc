"""Prompt tokens to judge one group of 8 multi-turn, tool-using trajectories.

Compares, for the same 8 email-search trajectories (same agent system prompt, tools and question;
different searches, reads and answers):

  pointwise        8 calls, each with the judge prompt and one full trajectory (context + tools + turns)
  group, no dedup  1 call with all 8 full trajectories (the shared context repeated 8 times)
  group (RULER)    1 call as groupwise sends it: shared prefix once, tools once, 8 remainders

Tokens are counted on the exact chat sent (system + user message, chat template applied) with
SmolLM2's tokenizer from the groupwise model cache; if it cannot be loaded, a bytes / 4 proxy is used
and the table says so. Run:  python bench/judge_tokens.py  [--seed 0] [--turns 3]
"""

from __future__ import annotations

import argparse
import json
import random

from groupwise.judge.prompt import DEFAULT_RUBRIC, JudgeItem, split_prefix, system_message, user_message

AGENT_SYSTEM = """\
You are an email research assistant for Jeff, an energy trader. You answer questions about Jeff's inbox \
by searching and reading his emails with the tools provided. Rules:
1. Always search before answering; never invent facts that are not in an email you have read.
2. Prefer the most recent email when several disagree, and say which one you used.
3. Use precise keywords: names of people, projects, places and dates. Try synonyms if a search finds nothing.
4. Read at most the three most promising emails; do not read emails whose subject is clearly unrelated.
5. Dates in the inbox are in the sender's time zone; today's date is given in the question.
6. When you know the answer, call return_final_answer with a short answer and the ids of the emails \
that support it. If the inbox does not contain the answer after a thorough search, answer "I don't know".
7. Be concise: no greetings, no restating the question, no apologies.
Examples of good answers: "The offsite is on June 3, 2001 (email <abc>)", "I don't know".
Examples of bad answers: guessing a date, citing an email you did not read, answering without sources."""

TOOLS = [
    {"type": "function", "function": {
        "name": "search_inbox",
        "description": "Search the user's inbox by keywords and optional filters. Returns up to max_results "
                       "emails as (message_id, subject, from, date, snippet), newest first.",
        "parameters": {"type": "object", "properties": {
            "keywords": {"type": "array", "items": {"type": "string"}, "description": "words that must all appear"},
            "from_address": {"type": "string", "description": "only emails from this sender"},
            "sent_after": {"type": "string", "description": "YYYY-MM-DD, inclusive"},
            "sent_before": {"type": "string", "description": "YYYY-MM-DD, exclusive"},
            "max_results": {"type": "integer", "description": "at most 10"}},
            "required": ["keywords"]}}},
    {"type": "function", "function": {
        "name": "read_email",
        "description": "Read one email in full: headers and body.",
        "parameters": {"type": "object", "properties": {"message_id": {"type": "string"}}, "required": ["message_id"]}}},
    {"type": "function", "function": {
        "name": "return_final_answer",
        "description": "Give the final answer and the ids of the emails that support it. Ends the episode.",
        "parameters": {"type": "object", "properties": {
            "answer": {"type": "string"}, "sources": {"type": "array", "items": {"type": "string"}}},
            "required": ["answer", "sources"]}}},
]

QUESTION = "Question: When is the offsite with the Houston gas desk scheduled, and where? Today is 2001-05-14."
WORDS = ("offsite Houston gas desk schedule venue agenda Galleria hotel June meeting trading team dinner "
         "budget travel confirm Kinder pipeline storage weather forecast desk review quarterly").split()


def first_observation(n_emails: int) -> str:
    """The question, plus (when n_emails > 0) an inbox overview every rollout of the scenario sees."""
    if not n_emails:
        return QUESTION
    rng = random.Random(1234)  # the same scenario for every trajectory of the group
    rows = [f"{i + 1}. {rng.choice(['kim', 'tana', 'mike', 'sara'])}@enron.com | 2001-0{rng.randint(3, 5)}-{rng.randint(10, 28)} | "
            + " ".join(rng.sample(WORDS, 5)).title() for i in range(n_emails)]
    return QUESTION + "\nRecent inbox (newest first):\n" + "\n".join(rows)


def trajectory(rng: random.Random, turns: int, n_emails: int = 0) -> list[dict]:
    messages: list[dict] = [{"role": "system", "content": AGENT_SYSTEM}, {"role": "user", "content": first_observation(n_emails)}]
    read: list[str] = []
    for turn in range(turns):
        call_id = f"call_{rng.randrange(10**6)}"
        if turn % 2 == 0:
            args = {"keywords": rng.sample(WORDS, 2), "max_results": 4}
            name = "search_inbox"
            result = [
                {"message_id": f"<{rng.randrange(10**8)}.JavaMail@thyme>", "subject": " ".join(rng.sample(WORDS, 4)).title(),
                 "from": f"{rng.choice(['kim', 'tana', 'mike', 'sara'])}@enron.com", "date": f"2001-0{rng.randint(3, 5)}-{rng.randint(10, 28)}",
                 "snippet": " ".join(rng.choices(WORDS, k=14))}
                for _ in range(4)
            ]
            content = json.dumps(result)
        else:
            mid = f"<{rng.randrange(10**8)}.JavaMail@thyme>"
            read.append(mid)
            args, name = {"message_id": mid}, "read_email"
            content = json.dumps({"message_id": mid, "subject": " ".join(rng.sample(WORDS, 4)).title(),
                                  "body": " ".join(rng.choices(WORDS, k=70))})
        messages.append({"role": "assistant", "content": None, "tool_calls": [
            {"id": call_id, "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}]})
        messages.append({"role": "tool", "tool_call_id": call_id, "content": content})
    answer = rng.choice(["June 3, 2001 at the Galleria hotel", "I don't know", "June 10 in Houston"])
    messages.append({"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_final", "type": "function", "function": {"name": "return_final_answer",
                                                               "arguments": json.dumps({"answer": answer, "sources": read})}}]})
    return messages


def make_counter():
    try:
        from groupwise.loading import load_tokenizer

        tok = load_tokenizer("smollm2-135m")

        def count(messages: list[dict]) -> int:
            text = tok.apply_chat_template(messages, tokenize=False)
            return len(tok(text, add_special_tokens=False)["input_ids"])

        return count, "SmolLM2-135M tokenizer (chat template applied)"
    except Exception as e:  # noqa: BLE001 - any failure means: fall back to the proxy, and say so
        return (lambda messages: sum(len(m["content"].encode()) for m in messages) // 4), f"bytes/4 proxy ({e})"


def measure(count, n: int, turns: int, n_emails: int, seed: int, sharing: int = 0, shared_turns: int = 0) -> dict[str, int]:
    """Token counts of one group; the first `sharing` rollouts repeat one rollout's first `shared_turns` turns."""
    rng = random.Random(seed)
    group = [trajectory(rng, turns, n_emails) for _ in range(n)]
    for ms in group[1:sharing]:  # a sharpened policy: same first tool calls, same (deterministic) results
        ms[2 : 2 + 2 * shared_turns] = group[0][2 : 2 + 2 * shared_turns]
    system = system_message(DEFAULT_RUBRIC)

    pointwise = 0
    for ms in group:
        context, tools, items = split_prefix([ms], TOOLS)
        pointwise += count([system, user_message(context, tools, [("1", items[0])])])
    full_items = [JudgeItem(messages=ms) for ms in group]
    no_dedup = count([system, user_message([], TOOLS, [(str(i + 1), it) for i, it in enumerate(full_items)])])
    context, tools, items = split_prefix(group, TOOLS)
    grouped = count([system, user_message(context, tools, [(str(i + 1), it) for i, it in enumerate(items)])])
    tree = count([system, user_message(context, tools, [(str(i + 1), it) for i, it in enumerate(items)], share_continuations=True)])
    shared = count([system, user_message(context, tools, [])])
    return {"pointwise": pointwise, "no_dedup": no_dedup, "grouped": grouped, "shared": shared, "tree": tree,
            "remainder": (grouped - shared) // n, "system": count([system])}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("-n", type=int, default=8, help="trajectories in the group")
    args = ap.parse_args()
    count, how = make_counter()
    print(f"{args.n} email-search trajectories per group; tokens counted with: {how}")
    print("S = shared tokens (judge prompt + agent context + tools), R = tokens of one trajectory's remainder")
    head = f"{'tool turns':>10}{'inbox rows':>11}{'S':>7}{'R':>7}{'pointwise x8':>14}{'group, repeated':>17}{'group, once':>13}{'pointwise/once':>16}"
    print(head)
    for turns, n_emails in [(1, 0), (3, 0), (5, 0), (1, 40), (3, 40), (3, 120)]:
        m = measure(count, args.n, turns, n_emails, args.seed)
        print(f"{turns:>10}{n_emails:>11}{m['shared']:>7}{m['remainder']:>7}{m['pointwise']:>14}{m['no_dedup']:>17}"
              f"{m['grouped']:>13}{m['pointwise'] / m['grouped']:>15.2f}x")
    print(f"the judge system prompt ({m['system']} tokens) is byte-identical in every call (provider prompt caching).")
    print(f"pointwise/once = n(S+R) / (S+nR): with n={args.n} it reaches 3x when S >= 3.2 R (2x when S >= 1.33 R).")
    print()
    print("rollouts that share their first tool turns (a sharpened policy), 3 tool turns, no inbox rows;")
    print("'+ shared turns once' = share_continuations=True (off by default)")
    print(f"{'rollouts sharing':>17}{'turns shared':>14}{'pointwise x8':>14}{'group, once':>13}{'+ shared turns once':>21}{'pointwise/that':>16}")
    for sharing, shared_turns in [(0, 0), (4, 1), (6, 1), (6, 2)]:
        m = measure(count, args.n, 3, 0, args.seed, sharing, shared_turns)
        print(f"{sharing:>17}{shared_turns:>14}{m['pointwise']:>14}{m['grouped']:>13}{m['tree']:>21}{m['pointwise'] / m['tree']:>15.2f}x")


if __name__ == "__main__":
    main()
