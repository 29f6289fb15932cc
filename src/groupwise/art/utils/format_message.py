"""`format_message` at ART's path (``art.utils.format_message``): one chat message as the text ART's
examples print while they watch a rollout ("Role:", the content, then each tool call as
``name(arguments)``)."""

from __future__ import annotations

from typing import Any

__all__ = ["format_message"]


def format_message(message: dict[str, Any]) -> str:
    """``"<Role>:\\n<content>"``, each function tool call on a line of its own below the content."""
    content = message.get("content", message.get("refusal", "")) or ""
    calls = [f"{call['function']['name']}({call['function']['arguments']})"
             for call in message.get("tool_calls") or [] if "function" in call]
    lines = "\n".join(calls)
    return f"{str(message['role']).capitalize()}:\n{content}{chr(10) if content and calls else ''}{lines}"
