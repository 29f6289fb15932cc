"""Where the judge runs. Every provider is reached through the `openai` SDK (the only client), at its
OpenAI-compatible endpoint; the judge never builds an engine: a local judge's client comes from the
backend (``local/<model>`` through `CLIENT_FACTORIES`, or ``client=LocalBackend.judge_client(...)``).

| judge_model prefix            | endpoint (default; variables that move it, first set wins) | key (first set wins)        |
|-------------------------------|-------------------------------------------------------|----------------------------------|
| ``openai/``                   | api.openai.com/v1; $OPENAI_API_BASE, $OPENAI_BASE_URL  | $OPENAI_API_KEY                  |
| ``anthropic/``                | api.anthropic.com/v1 (OpenAI SDK compatibility); $ANTHROPIC_API_BASE, $ANTHROPIC_BASE_URL | $ANTHROPIC_API_KEY |
| ``gemini/``                   | generativelanguage.googleapis.com/v1beta/openai; $GEMINI_API_BASE | $GEMINI_API_KEY or $GOOGLE_API_KEY |
| ``together_ai/`` (together/)  | api.together.xyz/v1; $TOGETHER_AI_API_BASE, $TOGETHERAI_API_BASE | $TOGETHER_API_KEY, $TOGETHER_AI_API_KEY, $TOGETHERAI_API_KEY |
| ``groq/``                     | api.groq.com/openai/v1; $GROQ_API_BASE                | $GROQ_API_KEY                    |
| ``openrouter/``               | openrouter.ai/api/v1; $OPENROUTER_API_BASE (headers from $OR_SITE_URL, $OR_APP_NAME) | $OPENROUTER_API_KEY or $OR_API_KEY |
| ``fireworks_ai/``             | api.fireworks.ai/inference/v1; $FIREWORKS_API_BASE    | $FIREWORKS_API_KEY, $FIREWORKS_AI_API_KEY, $FIREWORKSAI_API_KEY, $FIREWORKS_AI_TOKEN |
| ``deepseek/``                 | api.deepseek.com/v1; $DEEPSEEK_API_BASE               | $DEEPSEEK_API_KEY                |
| ``xai/``                      | api.x.ai/v1; $XAI_API_BASE                            | $XAI_API_KEY                     |
| ``mistral/``                  | api.mistral.ai/v1; $MISTRAL_AZURE_API_BASE (/v1 added) | $MISTRAL_AZURE_API_KEY or $MISTRAL_API_KEY |
| ``hosted_vllm/`` (vllm/, sglang/) | $HOSTED_VLLM_API_BASE or base_url= (a vLLM/sglang server) | $HOSTED_VLLM_API_KEY or none |
| ``ollama/`` (ollama_chat/)    | localhost:11434/v1; $OLLAMA_API_BASE, $OLLAMA_HOST (the host: /v1 added) | none   |
| ``local/``                    | groupwise's engine in this process (the backend extra), loaded once per model | none     |
| any name + base_url=          | that OpenAI-compatible server                         | api_key=, the prefix's key, or none |

The prefixes, and the variables, are LiteLLM's (as of litellm 1.65: its ``get_llm_provider`` and each
provider's config), which ART's RULER calls: an ART program that points its judge elsewhere with one of
them (a local vLLM or Ollama, a proxy) reaches the same server here. Where LiteLLM reads a provider's
*native* API base (Anthropic's, Mistral's, Ollama's host), the OpenAI-compatible path under it is used
(``/v1``). As in LiteLLM, an explicit ``base_url=`` (ART: ``extra_litellm_params={"api_base": ...}``)
wins over the variables, then ``litellm.api_base`` / ``litellm.api_key`` when a program set them on an
imported litellm; the model name sent is the part after the prefix. OpenAI's and Anthropic's own model
names need no prefix (``o4-mini``, ``gpt-4.1``, ``claude-sonnet-4-5``: ``openai/`` and ``anthropic/``).
With base_url= a known prefix is still stripped and its key variables still read when set.

Every `Endpoint` records where its URL came from (`Endpoint.source`): a judge that cannot be reached
says which URL, chosen by which variable or argument, so a local judge that is down is not mistaken for
a bad answer.
"""

from __future__ import annotations

import importlib
import os
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from groupwise.config import DEFAULT_JUDGE_TIMEOUT_S
from groupwise.errors import ConfigError, JudgeError, MissingDependencyError

__all__ = ["CLIENT_FACTORIES", "PROVIDERS", "Endpoint", "Provider", "register_client_factory", "resolve"]

IN_PROCESS_HOST = "groupwise.local"  # the host of groupwise.inference.client.BASE_URL (no socket behind it)

# What response_format="auto" sends where the provider is not known to want less: OpenAI's strict JSON schema.
JSON_SCHEMA = "json_schema"


@dataclass(frozen=True)
class Provider:
    """An OpenAI-compatible judge endpoint: its URL, where its key is, and how it bills and answers."""

    base_url: str | None  # None: from `url_vars` or base_url= (self-hosted servers)
    key_vars: tuple[str, ...] = ()  # environment variables holding the key, first set wins
    key_required: bool = True
    paid: bool = True  # bills per token: an unknown price is flagged
    # environment variables that set (or override) the URL, first set wins: LiteLLM's name besides the
    # SDK's, so an ART program's judge, which LiteLLM routed, goes where it went there
    url_vars: tuple[str, ...] = ()
    response_format: str = JSON_SCHEMA  # what response_format="auto" sends to this provider
    # a path the OpenAI-compatible routes are under, added to a URL from `url_vars` / base_url= that lacks
    # it: LiteLLM's variable holds the provider's native base there (Anthropic's, Mistral's, Ollama's host)
    openai_path: str = ""
    header_vars: tuple[tuple[str, str], ...] = ()  # (HTTP header, environment variable) sent when set


PROVIDERS: dict[str, Provider] = {
    # LiteLLM reads OPENAI_API_BASE; the openai SDK (which LiteLLM's requests go through) OPENAI_BASE_URL
    "openai": Provider("https://api.openai.com/v1", ("OPENAI_API_KEY",), url_vars=("OPENAI_API_BASE", "OPENAI_BASE_URL")),
    # Anthropic's OpenAI compatibility ignores response_format: answers are parsed strictly, with repair.
    "anthropic": Provider("https://api.anthropic.com/v1/", ("ANTHROPIC_API_KEY",), response_format="none",
                          url_vars=("ANTHROPIC_API_BASE", "ANTHROPIC_BASE_URL"), openai_path="/v1"),
    "gemini": Provider("https://generativelanguage.googleapis.com/v1beta/openai/", ("GEMINI_API_KEY", "GOOGLE_API_KEY"),
                       url_vars=("GEMINI_API_BASE",)),
    "together_ai": Provider("https://api.together.xyz/v1", ("TOGETHER_API_KEY", "TOGETHER_AI_API_KEY", "TOGETHERAI_API_KEY"),
                            url_vars=("TOGETHER_AI_API_BASE", "TOGETHERAI_API_BASE")),
    "groq": Provider("https://api.groq.com/openai/v1", ("GROQ_API_KEY",), response_format="json_object",
                     url_vars=("GROQ_API_BASE",)),
    "openrouter": Provider("https://openrouter.ai/api/v1", ("OPENROUTER_API_KEY", "OR_API_KEY"),
                           url_vars=("OPENROUTER_API_BASE",),
                           header_vars=(("HTTP-Referer", "OR_SITE_URL"), ("X-Title", "OR_APP_NAME"))),
    "fireworks_ai": Provider("https://api.fireworks.ai/inference/v1",
                             ("FIREWORKS_API_KEY", "FIREWORKS_AI_API_KEY", "FIREWORKSAI_API_KEY", "FIREWORKS_AI_TOKEN"),
                             url_vars=("FIREWORKS_API_BASE",)),
    "deepseek": Provider("https://api.deepseek.com/v1", ("DEEPSEEK_API_KEY",), response_format="json_object",
                         url_vars=("DEEPSEEK_API_BASE",)),
    "xai": Provider("https://api.x.ai/v1", ("XAI_API_KEY",), url_vars=("XAI_API_BASE",)),
    "mistral": Provider("https://api.mistral.ai/v1", ("MISTRAL_AZURE_API_KEY", "MISTRAL_API_KEY"),
                        url_vars=("MISTRAL_AZURE_API_BASE",), openai_path="/v1"),
    "hosted_vllm": Provider(None, ("HOSTED_VLLM_API_KEY",), key_required=False, paid=False, url_vars=("HOSTED_VLLM_API_BASE",)),
    # OLLAMA_API_BASE is LiteLLM's, OLLAMA_HOST Ollama's own: both name the host, its OpenAI routes are under /v1
    "ollama": Provider("http://localhost:11434/v1", key_required=False, paid=False,
                       url_vars=("OLLAMA_API_BASE", "OLLAMA_HOST"), openai_path="/v1"),
}
# Judges that another layer of groupwise serves, by prefix: a factory ``model name -> AsyncOpenAI client``,
# or ``"module:function"`` naming one, imported on first use. The judge looks names up here and never
# imports the engine: the ``local`` entry is the backend's in-process engine (groupwise/backend/judges.py),
# importable only with the backend extra. `register_client_factory` adds or replaces an entry.
CLIENT_FACTORIES: dict[str, "str | Callable[[str], Any]"] = {"local": "groupwise.backend.judges:local_judge_client"}


def register_client_factory(prefix: str, factory: "str | Callable[[str], Any]") -> None:
    """Serve judge names ``<prefix>/<model>`` with ``factory(model)``, an `openai.AsyncOpenAI` client."""
    CLIENT_FACTORIES[prefix] = factory


def _factory_client(prefix: str, model: str, judge_model: str) -> Any:
    factory = CLIENT_FACTORIES[prefix]
    try:
        if isinstance(factory, str):  # resolved on each use (imports are cached): the registry keeps its entry
            module, _, name = factory.partition(":")
            factory = getattr(importlib.import_module(module), name)
        return factory(model)
    except ModuleNotFoundError as exc:  # the factory's layer needs an extra that is not installed (torch)
        if prefix != "local":
            raise
        raise MissingDependencyError(f"the local judge {judge_model!r}", "backend", exc.name or "torch") from exc


ALIASES = {"together": "together_ai", "vllm": "hosted_vllm", "sglang": "hosted_vllm", "ollama_chat": "ollama",
           "fireworks": "fireworks_ai"}


@dataclass
class Endpoint:
    """A resolved judge: the client, the model name to send, and how to account for it."""

    client: Any  # openai.AsyncOpenAI
    model: str  # the name sent in the request
    label: str  # the name used for prices and cache keys, e.g. "openai/o4-mini"
    base_url: str
    local: bool = False
    paid: bool = False  # a provider that bills per token: an unknown price is flagged
    response_format: str = JSON_SCHEMA  # what response_format="auto" means here
    source: str = "the caller's client"  # where base_url came from (a variable, an argument, the default)


def _accepted() -> str:
    names = sorted([*PROVIDERS, *CLIENT_FACTORIES]) + [f"{a} (= {p})" for a, p in sorted(ALIASES.items())]
    return ", ".join(names)


# Model names LiteLLM routes without a prefix (its model list): OpenAI's and Anthropic's own.
_BARE_NAMES = ((re.compile(r"^(gpt-|chatgpt-|ft:gpt-|o\d+(-|$))"), "openai"), (re.compile(r"^claude-"), "anthropic"))


def _provider(judge_model: str) -> tuple[str | None, str]:
    """(provider name, model name to send); (None, judge_model) when there is no known prefix."""
    prefix, sep, rest = judge_model.partition("/")
    name = ALIASES.get(prefix, prefix)
    if sep and rest and name in PROVIDERS:
        return name, rest
    if not sep:
        for pattern, provider in _BARE_NAMES:
            if pattern.match(judge_model):
                return provider, judge_model
    return None, judge_model


def _key(provider: Provider, judge_model: str, given: str | None) -> str | None:
    key = given or next((os.environ[v] for v in provider.key_vars if os.environ.get(v)), None)
    if not key and provider.key_required:
        names = " or ".join(provider.key_vars)
        raise JudgeError(
            f"judge {judge_model!r} needs an API key, but {names} is not set. Set it (export "
            f"{provider.key_vars[0]}=...), pass api_key=..., or judge with a model your backend serves "
            "(LocalBackend.judge_client)."
        )
    return key


def _client(base_url: str | None, api_key: str, timeout_s: float, headers: dict[str, str] | None = None) -> Any:
    from openai import AsyncOpenAI

    # max_retries=0: the judge retries itself (bounded, with backoff, and it also retries bad answers).
    return AsyncOpenAI(base_url=base_url, api_key=api_key, timeout=timeout_s, max_retries=0,
                       default_headers=headers or None)


def resolve(
    judge_model: str,
    *,
    base_url: str | None = None,
    api_key: str | None = None,
    timeout_s: float = DEFAULT_JUDGE_TIMEOUT_S,
    client: Any = None,
) -> Endpoint:
    """Turn a judge name (and optional endpoint) into an `Endpoint`; errors name what to fix."""
    if not isinstance(judge_model, str) or not judge_model.strip():
        raise ConfigError(f"judge_model={judge_model!r} must be a non-empty string like 'openai/o4-mini'", what="judge")
    if client is not None:  # an AsyncOpenAI the caller built (tests, custom auth, a backend's judge client)
        url = str(client.base_url).rstrip("/")
        # A client of an engine served in process (`model.openai_client()` judging with the policy's base
        # weights, `name@0`, or `LocalBackend.judge_client`) is a small local judge: greedy, bounded
        # explanations. Such clients address the host name the in-process transport answers to.
        return Endpoint(client=client, model=judge_model, label=judge_model, base_url=url,
                        local=client.base_url.host == IN_PROCESS_HOST)
    prefix, sep, rest = judge_model.partition("/")
    if sep and rest and prefix in CLIENT_FACTORIES and base_url is None:
        client = _factory_client(prefix, rest, judge_model)
        return Endpoint(client=client, model=rest, label=judge_model, base_url=str(client.base_url).rstrip("/"),
                        local=client.base_url.host == IN_PROCESS_HOST)
    name, model = _provider(judge_model)
    provider = PROVIDERS.get(name) if name else None
    source = "base_url= (ART: extra_litellm_params['api_base'])"
    if base_url is None:
        base_url, source = _litellm_global("api_base"), "litellm.api_base"
    if base_url is not None:
        if provider is not None and provider.openai_path and not _has_path(base_url, provider.openai_path):
            base_url = base_url.rstrip("/") + provider.openai_path
        # A server of your own: the prefix's key is sent when set, but none is required.
        key = (api_key or _litellm_global("api_key")
               or next((os.environ[v] for v in (provider.key_vars if provider else ()) if os.environ.get(v)), None))
        return Endpoint(_client(base_url, key or "EMPTY", timeout_s, _headers(provider)), model, judge_model, base_url,
                        response_format=provider.response_format if provider else JSON_SCHEMA, source=source)
    if provider is None:
        prefix = judge_model.partition("/")[0] if "/" in judge_model else None
        what = f"unknown judge provider {prefix!r} in {judge_model!r}" if prefix else f"judge_model={judge_model!r} names no provider"
        raise ConfigError(f"{what}. Accepted prefixes: {_accepted()}; or pass base_url= (ART: "
                          f"extra_litellm_params={{'api_base': ...}}) for any OpenAI-compatible server.",
                          what="judge")
    var = next((v for v in provider.url_vars if os.environ.get(v)), None)
    if var is not None:
        url, source = os.environ[var].strip(), f"${var}"
        if not url.startswith(("http://", "https://")):  # OLLAMA_HOST=127.0.0.1:11434, as Ollama takes it
            url = "http://" + url
        if provider.openai_path and not _has_path(url, provider.openai_path):
            url = url.rstrip("/") + provider.openai_path
    else:
        url = provider.base_url
        source = (f"{name}'s default (set {' or '.join('$' + v for v in provider.url_vars)} to move it)"
                  if provider.url_vars else f"{name}'s default")
    if url is None:
        raise ConfigError(f"judge {judge_model!r} is self-hosted: pass base_url= (ART: extra_litellm_params="
                          f"{{'api_base': 'http://host:8000/v1'}}) or set {' or '.join(provider.url_vars)}",
                          what="judge")
    key = _key(provider, judge_model, api_key or _litellm_global("api_key"))
    local_server = urlsplit(url).hostname in ("localhost", "127.0.0.1", "::1")
    return Endpoint(_client(url, key or "EMPTY", timeout_s, _headers(provider)), model, judge_model, url,
                    paid=provider.paid and not local_server, response_format=provider.response_format, source=source)


def _has_path(url: str, path: str) -> bool:
    return urlsplit(url).path.rstrip("/").endswith(path.rstrip("/"))


def _headers(provider: Provider | None) -> dict[str, str]:
    return {header: os.environ[var] for header, var in (provider.header_vars if provider else ()) if os.environ.get(var)}


def _litellm_global(name: str) -> str | None:
    """``litellm.api_base`` / ``litellm.api_key`` when the program imported litellm and set them (LiteLLM
    reads them after the call's own arguments, before the environment). litellm is never imported here."""
    module = sys.modules.get("litellm")
    value = getattr(module, name, None) if module is not None else None
    return value if isinstance(value, str) and value else None
