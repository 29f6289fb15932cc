# Restated from zenml-io/zenml-projects, art-rl/environment/tools.py and email_db.py (corpus/README.md):
# LangChain tools over a SQLite inbox (a few emails here, the Enron corpus there).
import sqlite3
from typing import Callable, List

from langchain_core.tools import tool

from environment.models import FinalAnswer, Scenario


def create_database(db_path: str) -> None:
    conn = sqlite3.connect(db_path)
    conn.execute("CREATE TABLE IF NOT EXISTS emails (message_id TEXT PRIMARY KEY, inbox TEXT, subject TEXT, body TEXT)")
    conn.executemany("INSERT OR REPLACE INTO emails VALUES (?, ?, ?, ?)", [
        (f"<{i}@enron>", "jeff@enron.com", f"Contract {i}", f"Contract {i} closes on Friday.") for i in range(4)])
    conn.commit()
    conn.close()


def create_email_tools(scenario: Scenario, db_path: str, on_final_answer: Callable[[FinalAnswer], None]):
    @tool
    def search_inbox(keywords: List[str]) -> List[dict]:
        """Search the inbox for emails matching all keywords."""
        conn = sqlite3.connect(db_path)
        rows = conn.execute("SELECT message_id, subject FROM emails WHERE inbox = ?", (scenario.inbox_address,)).fetchall()
        conn.close()
        return [{"message_id": m, "snippet": s} for m, s in rows if all(k.lower() in s.lower() for k in keywords)]

    @tool
    def read_email(message_id: str) -> dict:
        """Read one email by its message id."""
        conn = sqlite3.connect(db_path)
        row = conn.execute("SELECT subject, body FROM emails WHERE message_id = ?", (message_id,)).fetchone()
        conn.close()
        return {"subject": row[0], "body": row[1]} if row else {"error": "not found"}

    @tool
    def return_final_answer_tool(answer: str, reference_message_ids: List[str]) -> dict:
        """Return the final answer and the ids of the emails it is based on."""
        final = FinalAnswer(answer=answer, source_ids=reference_message_ids)
        on_final_answer(final)
        return final.model_dump()

    return [search_inbox, read_email, return_final_answer_tool]
