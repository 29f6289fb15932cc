"""Prompt tokens to judge one group of 8 multi-turn, tool-using trajectories: one group call vs 8 pointwise calls.

Main table (realistic): the group is built from the REAL email environment (groupwise.envs.email_search:
its SQLite inbox, its real `search_emails` / `read_email`, one of its real questions). A scripted agent
plays 8 rollouts of ONE question; its choices vary per rollout (seeded): keyword subsets drawn from the
question's words (sometimes with a distractor word), which results to read, 1-5 tool turns, then a
right, wrong or "I don't know" answer. Tool results are what the real tools return, serialised as the
env's rollout does; tool-call ids are random like a server's (call_ + 24 hex). Rollouts of one
question search the same inbox, so the same search returns the same rows and several rollouts read
the same email: that overlap is what a group call can send once.

Secondary table (worst case: nothing shared): the old synthetic trajectories, whose every tool result
is random and distinct, so only the task context can be shared.

Columns (all use groupwise's rendering, tool-call ids normalised):
  pointwise x8        8 calls, each: judge prompt + task context + tools + one trajectory (repeated long
                      contents inside that one trajectory are shared too: the most favourable pointwise)
  group, prefix once  1 call: judge prompt, task context and tools once, 8 remainders in full
  + shared outputs    1 call as groupwise sends it by default: also each long content that occurs more
                      than once written once in <shared_outputs> (share_outputs=True)
  + continuations     also share_continuations=True (shared leading turns as one line; off by default)

Tokens are counted on the exact chat sent (system + user message, chat template applied) with
SmolLM2's tokenizer from the groupwise model cache; if it cannot be loaded, a bytes / 4 proxy is used
and the output says so. Run:  python bench/judge_tokens.py  [--seeds 0,1,2]
"""

from __future__ import annotations

import argparse
import json
import random

from groupwise.judge.prompt import DEFAULT_RUBRIC, split_prefix, system_message, user_message

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
        from groupwise.runtime.loading import load_tokenizer

        tok = load_tokenizer("smollm2-135m")

        def count(messages: list[dict]) -> int:
            text = tok.apply_chat_template(messages, tokenize=False)
            return len(tok(text, add_special_tokens=False)["input_ids"])

        return count, "SmolLM2-135M tokenizer (chat template applied)"
    except Exception as e:  # noqa: BLE001 - any failure means: fall back to the proxy, and say so
        return (lambda messages: sum(len(m["content"].encode()) for m in messages) // 4), f"bytes/4 proxy ({e})"


# ----------------------------------------------------------------------------- the realistic group

QUESTION_IDS = ("q-m5-6fdaca", "q-m6-c740a3", "q-m2-1a461e", "q-m4-69657a")  # dinner, room, budget, invoice
DISTRACTORS = ("office", "schedule", "weekly", "update", "Monday", "project", "notes", "meeting")
STOP = {"what", "which", "is", "the", "for", "in", "of", "a", "an", "from", "who", "when", "where", "s", "number"}


def email_group(question_id: str, seed: int, n: int = 8) -> tuple[list[list[dict]], list, dict]:
    """(message lists, tools, profile): n scripted rollouts of one real question on the real inbox."""
    import re

    from groupwise.envs.email_search import tools as T
    from groupwise.envs.email_search.env import SYSTEM_PROMPT
    from groupwise.envs.email_search.inbox import RESTAURANTS, default_database, generate_corpus
    from groupwise.envs.email_search.questions import is_correct, is_idk, questions_from_corpus

    db = str(default_database(0))
    corpus = generate_corpus(0)
    q = next(x for x in questions_from_corpus(corpus) if x.id == question_id)
    words = [w for w in re.findall(r"[\w&-]+", q.question) if w.lower() not in STOP]
    # wrong answers the agent may give: the same kind of fact from other questions of the corpus
    wrong_pool = sorted({f.answer for f in corpus.facts if f.kind == q.kind and f.answer != q.answer}) or list(RESTAURANTS)
    system = SYSTEM_PROMPT.format(inbox=q.inbox, today=q.today, max_turns=6)
    lists, answers, outputs = [], [], []
    for r in range(n):
        rng = random.Random(f"{question_id}/{seed}/{r}")
        ms: list[dict] = [{"role": "system", "content": system}, {"role": "user", "content": q.question}]
        seen: list[str] = []  # message ids returned by this rollout's searches, in order
        read: list[str] = []

        def call(name: str, args: dict, result) -> None:
            call_id = "call_" + "".join(rng.choice("0123456789abcdef") for _ in range(24))
            ms.append({"role": "assistant", "content": None, "tool_calls": [
                {"id": call_id, "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}]})
            content = json.dumps(result, ensure_ascii=False)  # as env.rollout serialises tool results
            ms.append({"role": "tool", "tool_call_id": call_id, "content": content})
            outputs.append(content)

        for _ in range(rng.randint(1, 5)):
            unread = [m for m in seen if m not in read]
            if unread and rng.random() < 0.55:  # read one of the top results it has not read yet
                mid = rng.choice(unread[:3])
                read.append(mid)
                call("read_email", {"message_id": mid}, T.read_email(db, q.inbox, mid))
                continue
            keywords = rng.sample(list(q.keywords) + words, rng.choice((1, 1, 2)))
            if rng.random() < 0.25:
                keywords = [*keywords[:1], rng.choice(DISTRACTORS)]
            result = T.search_emails(db, q.inbox, keywords)
            seen += [row["message_id"] for row in result if row["message_id"] not in seen]
            call("search_emails", {"keywords": keywords}, result)
        if q.source_id in read and rng.random() < 0.8:
            answer = q.answer
        else:
            answer = rng.choice(["I don't know", rng.choice(wrong_pool)])
        final = {"answer": answer, "sources": read[-2:]}
        call("return_final_answer", final, {"ok": True})
        answers.append("right" if is_correct(answer, q.answer) else "idk" if is_idk(answer) else "wrong")
        lists.append(ms)
    long = [o for o in outputs if len(o) >= 200]
    profile = {"question": q.question, "turns": [(len(ms) - 2) // 2 - 1 for ms in lists],
               "answers": answers, "long_outputs": len(long), "distinct_long": len(set(long))}
    return lists, T.TOOLS, profile


# ----------------------------------------------------------------------------- counting


def measure(count, lists: list[list[dict]], tools) -> dict[str, int]:
    """Prompt tokens of one group judged pointwise, as one call, and with each sharing option."""
    system = system_message(DEFAULT_RUBRIC)
    context, common_tools, items = split_prefix(lists, tools)
    shown = [(str(i + 1), it) for i, it in enumerate(items)]
    pointwise = sum(count([system, user_message(context, common_tools, [("1", it)], share_outputs=True)]) for it in items)
    once = count([system, user_message(context, common_tools, shown)])
    outputs = count([system, user_message(context, common_tools, shown, share_outputs=True)])
    both = count([system, user_message(context, common_tools, shown, share_outputs=True, share_continuations=True)])
    return {"pointwise": pointwise, "once": once, "outputs": outputs, "both": both,
            "shared": count([system, user_message(context, common_tools, [])])}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", default="0,1,2", help="scripted-agent seeds (one group per question and seed)")
    ap.add_argument("-n", type=int, default=8, help="trajectories in the group")
    args = ap.parse_args()
    count, how = make_counter()
    print(f"{args.n} trajectories per group; tokens counted with: {how}")
    print()
    print("Realistic: 8 scripted rollouts of one real email-search question (real inbox, real tools)")
    print("S = judge prompt + task context + tools (sent once by a group call); answers r/w/i = right/wrong/I don't know")
    print("| question | seed | tool turns | answers r/w/i | long outputs (distinct) | S | pointwise x8 | group, prefix once | "
          "+ shared outputs | + continuations | pointwise / prefix once | pointwise / + shared outputs |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    ratios = []
    for qid in QUESTION_IDS:
        for seed in (int(x) for x in args.seeds.split(",")):
            lists, tools, prof = email_group(qid, seed, args.n)
            m = measure(count, lists, tools)
            a = prof["answers"]
            ratios.append((m["pointwise"] / m["once"], m["pointwise"] / m["outputs"]))
            print(f"| {prof['question'][:40]} | {seed} | {' '.join(map(str, prof['turns']))} | "
                  f"{a.count('right')}/{a.count('wrong')}/{a.count('idk')} | {prof['long_outputs']} ({prof['distinct_long']}) | "
                  f"{m['shared']} | {m['pointwise']} | {m['once']} | {m['outputs']} | {m['both']} | "
                  f"{ratios[-1][0]:.2f}x | {ratios[-1][1]:.2f}x |")
    lo, hi = min(r[1] for r in ratios), max(r[1] for r in ratios)
    mean = sum(r[1] for r in ratios) / len(ratios)
    print(f"pointwise / (+ shared outputs): min {lo:.2f}x, mean {mean:.2f}x, max {hi:.2f}x over {len(ratios)} groups; "
          f"prefix once alone: mean {sum(r[0] for r in ratios) / len(ratios):.2f}x")
    print()
    print("Worst case, nothing shared: synthetic trajectories whose every tool result is random and distinct")
    print("| tool turns | inbox rows in the task | S | pointwise x8 | group, prefix once | + shared outputs | pointwise / + shared outputs |")
    print("|---|---|---|---|---|---|---|")
    for turns, n_emails in [(1, 0), (3, 0), (5, 0), (3, 40)]:
        rng = random.Random(0)
        lists = [trajectory(rng, turns, n_emails) for _ in range(args.n)]
        m = measure(count, lists, TOOLS)
        print(f"| {turns} | {n_emails} | {m['shared']} | {m['pointwise']} | {m['once']} | {m['outputs']} | "
              f"{m['pointwise'] / m['outputs']:.2f}x |")
    print(f"the judge system prompt ({count([system_message(DEFAULT_RUBRIC)])} tokens) is byte-identical in every call.")


if __name__ == "__main__":
    main()
