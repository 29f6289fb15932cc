"""ART's path ``art.dev.openai_server`` of its vLLM server settings (``from art.dev.openai_server import
OpenAIServerConfig``); the types are `groupwise.dev`'s."""

from groupwise.art.dev import OpenAIServerConfig, ServerArgs

__all__ = ["OpenAIServerConfig", "ServerArgs"]
