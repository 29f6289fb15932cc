"""ART 0.2's path of the LiteLLM helper: ``from art.utils.litellm_utils import
convert_litellm_choice_to_openai`` ports as ``from groupwise.utils.litellm_utils import ...``; the helper
itself is `groupwise.utils.litellm`'s (ART 0.3 moved it there)."""

from groupwise.art.utils.litellm import convert_litellm_choice_to_openai

__all__ = ["convert_litellm_choice_to_openai"]
