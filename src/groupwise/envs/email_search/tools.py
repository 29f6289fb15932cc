"""The agent's tools: OpenAI tool schemas, and their implementations over the SQLite inbox.

The implementations take the database path and the inbox (the owner's address) first; the rollout
binds those, so the model only sees the arguments in `TOOLS` and can never read another inbox.
Every tool returns JSON-able data; bad arguments raise `ToolError` with a message meant for the
model (the rollout sends it back as the tool result and counts it).
"""

from __future__ import annotations

import json
import re
import sqlite3
from contextlib import closing
from pathlib import Path
from typing import Any

from groupwise.envs._chat import sendable_text

MAX_RESULTS = 10
MESSAGE_ID_PATTERN = r"^m[0-9]{1,2}-[0-9a-f]{6}$"  # the ids inbox.py makes: "m3-0a1b2c"

# The length limits are there for constrained decoding (tool_choice="required"): a grammar built from
# this schema cannot run on with a 40-keyword list until max_tokens cuts the JSON (measured: base
# SmolLM2-135M did exactly that), and hosted APIs accept these keywords too.

TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "search_emails",
            "description": "Full-text search of the user's inbox. Returns up to max_results emails "
            "(message_id, subject, from, date, snippet), best match first.",
            "parameters": {
                "type": "object",
                "properties": {
                    "keywords": {"type": "array", "items": {"type": "string", "maxLength": 24},
                                 "minItems": 1, "maxItems": 4,
                                 "description": "Words that must all appear in the subject or body."},
                    "from_addr": {"type": "string", "maxLength": 60,
                                  "description": "Only emails whose sender contains this."},
                    "to_addr": {"type": "string", "maxLength": 60,
                                "description": "Only emails whose recipients contain this."},
                    "sent_after": {"type": "string", "pattern": r"^\d{4}-\d{2}-\d{2}$",
                                   "description": "Only emails sent on or after this day, YYYY-MM-DD."},
                    "sent_before": {"type": "string", "pattern": r"^\d{4}-\d{2}-\d{2}$",
                                    "description": "Only emails sent before this day, YYYY-MM-DD."},
                    "max_results": {"type": "integer", "minimum": 1, "maximum": MAX_RESULTS,
                                    "description": f"At most {MAX_RESULTS} (the default)."},
                },
                "required": ["keywords"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "read_email",
            "description": "The full email (headers and body) with this message_id.",
            "parameters": {
                "type": "object",
                "properties": {"message_id": {"type": "string", "pattern": MESSAGE_ID_PATTERN,
                                              "description": "An id from search_emails."}},
                "required": ["message_id"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "return_final_answer",
            "description": "Give the final answer and the message_ids it comes from. Ends the task. "
            "Answer \"I don't know\" when the inbox does not say.",
            "parameters": {
                "type": "object",
                "properties": {
                    "answer": {"type": "string", "maxLength": 80, "description": "The answer, as short as possible."},
                    "sources": {"type": "array", "items": {"type": "string", "pattern": MESSAGE_ID_PATTERN},
                                "maxItems": 3, "description": "message_ids of the emails that contain the answer."},
                },
                "required": ["answer", "sources"],
            },
        },
    },
]
TOOL_NAMES = tuple(t["function"]["name"] for t in TOOLS)

_DAY = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}")


class ToolError(ValueError):
    """A tool call the model got wrong; the message is sent back to the model."""


def _sql_text(value: Any) -> str:
    # SQLite stores UTF-8: a lone surrogate in a model's argument is passed as its escape, which no
    # email contains, so the filter matches nothing instead of the tool raising UnicodeEncodeError.
    return sendable_text(str(value))


def _connect(db: str | Path) -> sqlite3.Connection:
    # Read-only: rollouts run concurrently and must never change the corpus.
    con = sqlite3.connect(f"file:{Path(db)}?mode=ro", uri=True)
    con.row_factory = sqlite3.Row
    return con


def fts_query(keywords: list[str]) -> str:
    """An FTS5 query requiring every keyword. Each word is quoted, so FTS5 syntax in it is inert."""
    words = [w for k in keywords for w in re.findall(r"[\w$@.'-]+", str(k)) if w.strip(".'-")]
    if not words:
        raise ToolError("search_emails needs at least one keyword (a word to look for).")
    return " AND ".join('"' + w.replace('"', '""') + '"' for w in words)


def search_emails(
    db: str | Path,
    inbox: str,
    keywords: list[str] | str,
    from_addr: str | None = None,
    to_addr: str | None = None,
    sent_after: str | None = None,
    sent_before: str | None = None,
    max_results: int = MAX_RESULTS,
) -> list[dict[str, str]]:
    """Emails of `inbox` containing every keyword, ranked by BM25; filters are case-insensitive substrings.

    `keywords` may be a list or one string (split on spaces: small models often send a string).
    `sent_after` includes that day, `sent_before` excludes it.
    """
    if isinstance(keywords, str):
        keywords = keywords.split()
    if not isinstance(keywords, list):
        raise ToolError(f"keywords must be a list of words, got {type(keywords).__name__}.")
    try:
        max_results = int(max_results)
    except (TypeError, ValueError):
        raise ToolError(f"max_results must be an integer, got {max_results!r}.") from None
    except OverflowError:  # float("inf"): JSON from a model can carry Infinity
        raise ToolError(f"max_results must be an integer between 1 and {MAX_RESULTS}, got {max_results!r}.") from None
    if not 1 <= max_results <= MAX_RESULTS:
        raise ToolError(f"max_results must be between 1 and {MAX_RESULTS}, got {max_results}.")
    for name, day in (("sent_after", sent_after), ("sent_before", sent_before)):
        if day is not None and not _DAY.fullmatch(str(day)):
            raise ToolError(f"{name} must be a day as YYYY-MM-DD, got {day!r}.")
    sql = [
        "SELECT e.message_id, e.subject, e.from_addr, e.date, snippet(emails_fts, 1, '', '', '...', 12) AS snippet",
        "FROM emails_fts JOIN emails e ON e.id = emails_fts.rowid",
        "WHERE emails_fts MATCH ? AND e.inbox = ?",
    ]
    args: list[Any] = [fts_query(keywords), inbox]
    if from_addr:
        sql.append("AND lower(e.from_addr) LIKE ?")
        args.append(f"%{_sql_text(from_addr).lower()}%")
    if to_addr:
        sql.append("AND lower(e.to_addrs) LIKE ?")
        args.append(f"%{_sql_text(to_addr).lower()}%")
    if sent_after:
        sql.append("AND e.date >= ?")
        args.append(str(sent_after))
    if sent_before:
        sql.append("AND e.date < ?")
        args.append(str(sent_before))
    sql.append("ORDER BY bm25(emails_fts) LIMIT ?")
    args.append(max_results)
    with closing(_connect(db)) as con:
        rows = con.execute(" ".join(sql), args).fetchall()
    return [
        {"message_id": r["message_id"], "subject": r["subject"], "from": r["from_addr"], "date": r["date"][:10],
         "snippet": r["snippet"]}
        for r in rows
    ]


def read_email(db: str | Path, inbox: str, message_id: str) -> dict[str, str]:
    """The whole email; a ToolError when `message_id` is not an email of this inbox."""
    with closing(_connect(db)) as con:
        row = con.execute(
            "SELECT message_id, subject, from_addr, to_addrs, date, body FROM emails WHERE message_id = ? AND inbox = ?",
            (_sql_text(message_id).strip().strip("<>"), inbox),
        ).fetchone()
    if row is None:
        raise ToolError(f"no email with message_id {message_id!r} in this inbox; use an id that search_emails returned.")
    return {"message_id": row["message_id"], "subject": row["subject"], "from": row["from_addr"],
            "to": row["to_addrs"], "date": row["date"], "body": row["body"]}


def return_final_answer(answer: str, sources: list[str] | None = None) -> dict[str, Any]:
    """Records the answer; the rollout ends the episode when it sees this call."""
    if not isinstance(answer, str):
        answer = json.dumps(answer) if not isinstance(answer, (int, float)) else str(answer)
    if isinstance(sources, str):
        sources = [sources]
    return {"answer": answer, "sources": [str(s) for s in (sources or [])]}
