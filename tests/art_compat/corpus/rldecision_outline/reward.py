# Restated from johnson7788/RLDecisionAgent, backend/MCP_Agents/rl_train/reward.py (corpus/README.md):
# the outline's structure kept (format) and its citations backed by what the search tool returned.
import re


def format_reward(input_task, output_task) -> float:
    if len(input_task) != len(output_task):
        return 0.0
    same = sum(1 for a, b in zip(input_task, output_task) if a.get("type") == b.get("type"))
    return same / max(1, len(input_task))


def search_reward(task, sources, tool_urls_seen=None) -> float:
    cited = sum(len(re.findall(r"\[\d+\]", str(item))) for item in task)
    backed = [u for u in sources if u in set(tool_urls_seen or [])]
    return min(1.0, 0.1 * cited) * (len(backed) / len(sources) if sources else 0.0)
