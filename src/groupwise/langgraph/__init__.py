"""ART's `art.langgraph`: train a LangGraph agent without changing it.

    from groupwise.langgraph import init_chat_model, wrap_rollout

    async def rollout(model, scenario):
        agent = build_graph(init_chat_model())          # any LangGraph agent on a LangChain chat model
        result = await agent.ainvoke({"messages": [...]})
        return gw.Trajectory(reward=score(result))      # messages and choices are filled in

    trajectory = await wrap_rollout(model, rollout)(model, scenario)

Needs the `langgraph` extra (LangChain's OpenAI chat model); the check below says so at import.
"""

from groupwise.errors import MissingDependencyError

try:
    import langchain_core  # noqa: F401
    import langchain_openai  # noqa: F401
except ImportError as exc:  # the extra is missing: say which install fixes it
    raise MissingDependencyError("groupwise.langgraph", "langgraph",
                                 (exc.name or "langchain-openai").replace("_", "-")) from exc

from groupwise.langgraph.chat_model import init_chat_model, wrap_rollout

__all__ = ["init_chat_model", "wrap_rollout"]
