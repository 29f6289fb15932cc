"""The judge's transport honours LiteLLM's conventions, which ART's RULER relies on (it calls the judge
through LiteLLM): for every provider prefix groupwise accepts, each environment variable LiteLLM reads
for that provider's base URL and key; ``extra_litellm_params`` (api_base, api_key, timeout, num_retries);
``litellm.api_base``/``api_key``; and a judge that cannot be reached is loud. Every case is a real HTTP
request to the scripted OpenAI-compatible judge on 127.0.0.1 (tests/judge/judge_helpers.py)."""

from __future__ import annotations

import socket
import sys
import types
import warnings

import pytest
from judge_helpers import Reply

import groupwise as gw
from groupwise.errors import GroupwiseWarning, JudgeError, JudgeUnreachableError
from groupwise.judge import providers, ruler_score_group

# LiteLLM 1.65's variables per prefix (base URL, key), read from its source: get_llm_provider and each
# provider's config. The table in groupwise.judge.providers must hold at least these, in this order.
LITELLM = {
    "openai": (["OPENAI_API_BASE"], ["OPENAI_API_KEY"]),
    "anthropic": (["ANTHROPIC_API_BASE", "ANTHROPIC_BASE_URL"], ["ANTHROPIC_API_KEY"]),
    "gemini": (["GEMINI_API_BASE"], ["GEMINI_API_KEY"]),
    "together_ai": (["TOGETHER_AI_API_BASE"], ["TOGETHER_API_KEY", "TOGETHER_AI_API_KEY", "TOGETHERAI_API_KEY"]),
    "groq": (["GROQ_API_BASE"], ["GROQ_API_KEY"]),
    "openrouter": (["OPENROUTER_API_BASE"], ["OPENROUTER_API_KEY", "OR_API_KEY"]),
    "fireworks_ai": (["FIREWORKS_API_BASE"], ["FIREWORKS_API_KEY", "FIREWORKS_AI_API_KEY", "FIREWORKSAI_API_KEY",
                                               "FIREWORKS_AI_TOKEN"]),
    "deepseek": (["DEEPSEEK_API_BASE"], ["DEEPSEEK_API_KEY"]),
    "xai": (["XAI_API_BASE"], ["XAI_API_KEY"]),
    "mistral": (["MISTRAL_AZURE_API_BASE"], ["MISTRAL_AZURE_API_KEY", "MISTRAL_API_KEY"]),
    "hosted_vllm": (["HOSTED_VLLM_API_BASE"], ["HOSTED_VLLM_API_KEY"]),
    "ollama": (["OLLAMA_API_BASE"], []),
}
ALL_VARS = sorted({v for p in providers.PROVIDERS.values() for v in (*p.url_vars, *p.key_vars)}
                  | {v for urls, keys in LITELLM.values() for v in (*urls, *keys)} | {"OR_SITE_URL", "OR_APP_NAME"})
CASES = [(name, url_var, key_var) for name, (urls, keys) in LITELLM.items()
         for url_var in urls for key_var in (keys or [None])]


def make_group(qualities) -> gw.TrajectoryGroup:
    task = [{"role": "user", "content": "What is 6 x 7?"}]
    return gw.TrajectoryGroup([gw.Trajectory(messages_and_choices=[*task, {"role": "assistant", "content": f"quality={q}"}])
                               for q in qualities])


@pytest.fixture
def clean_env(monkeypatch):
    for var in ALL_VARS:
        monkeypatch.delenv(var, raising=False)
    monkeypatch.delitem(sys.modules, "litellm", raising=False)
    return monkeypatch


def test_the_provider_table_reads_every_variable_litellm_reads_for_its_prefixes():
    for name, (urls, keys) in LITELLM.items():
        provider = providers.PROVIDERS[name]
        assert list(provider.url_vars[:len(urls)]) == urls, name  # LiteLLM's first, in its order
        assert set(keys) <= set(provider.key_vars), name


@pytest.mark.parametrize("name,url_var,key_var", CASES, ids=[f"{n}-{u}-{k}" for n, u, k in CASES])
async def test_each_litellm_variable_points_its_provider_at_the_server(judge_server, clean_env, name, url_var, key_var):
    provider = providers.PROVIDERS[name]
    # where LiteLLM's variable names the provider's native base (Anthropic's, Mistral's, Ollama's host), give
    # the host: the OpenAI-compatible /v1 is added, as LiteLLM adds its own routes
    url = judge_server.url.removesuffix("/v1") if provider.openai_path else judge_server.url
    clean_env.setenv(url_var, url)
    if key_var:
        clean_env.setenv(key_var, f"sk-{key_var.lower()}")
    judged = await ruler_score_group(make_group([0.2, 0.9]), f"{name}/some-model", backoff_s=0.0)
    assert [t.reward for t in judged.trajectories] == [0.2, 0.9]
    assert judge_server.requests[-1]["model"] == "some-model"
    expected = f"sk-{key_var.lower()}" if key_var else "EMPTY"
    assert judge_server.headers[-1]["authorization"] == f"Bearer {expected}"
    endpoint = providers.resolve(f"{name}/some-model")
    assert endpoint.source == f"${url_var}" and endpoint.base_url.rstrip("/") == judge_server.url
    assert not endpoint.paid  # a server on this machine bills nothing: no unknown-price flag


async def test_extra_litellm_params_api_base_and_api_key_win_over_the_variables(judge_server, clean_env):
    clean_env.setenv("OPENAI_API_BASE", "http://127.0.0.1:9/v1")  # nothing listens there
    clean_env.setenv("OPENAI_API_KEY", "sk-env")
    await ruler_score_group(make_group([0.3, 0.6]), "openai/gpt-4.1", backoff_s=0.0,
                            extra_litellm_params={"api_base": judge_server.url, "api_key": "sk-param"})
    assert judge_server.headers[-1]["authorization"] == "Bearer sk-param"
    # base_url is LiteLLM's other spelling; without api_key the prefix's variable is sent
    await ruler_score_group(make_group([0.3, 0.6]), "openai/gpt-4.1", backoff_s=0.0,
                            extra_litellm_params={"base_url": judge_server.url})
    assert judge_server.headers[-1]["authorization"] == "Bearer sk-env"


async def test_litellm_module_settings_are_read_after_the_arguments_and_before_the_environment(judge_server, clean_env):
    # a program that set litellm.api_base / litellm.api_key (litellm itself is optional: a module stands in)
    litellm = types.ModuleType("litellm")
    litellm.api_base, litellm.api_key = judge_server.url, "sk-module"
    clean_env.setitem(sys.modules, "litellm", litellm)
    clean_env.setenv("GROQ_API_BASE", "http://127.0.0.1:9/v1")
    clean_env.setenv("GROQ_API_KEY", "sk-env")
    await ruler_score_group(make_group([0.3, 0.6]), "groq/llama", backoff_s=0.0)
    assert judge_server.headers[-1]["authorization"] == "Bearer sk-module"


async def test_extra_litellm_params_num_retries_and_timeout(judge_server, clean_env):
    for _ in range(2):
        judge_server.script.append(Reply(status=503))
    judged = await ruler_score_group(make_group([0.3, 0.6]), "judge", backoff_s=0.0,
                                     extra_litellm_params={"api_base": judge_server.url, "num_retries": 2})
    assert judged is not None and len(judge_server.requests) == 3
    judge_server.script.append(Reply(status=503))
    with pytest.raises(JudgeError, match="after 1 attempts"):
        await ruler_score_group(make_group([0.3, 0.6]), "judge", backoff_s=0.0,
                                extra_litellm_params={"api_base": judge_server.url, "num_retries": 0})
    judge_server.script.append(Reply(delay=1.0))  # well past the 0.2 s timeout; the server's teardown waits it out
    with pytest.raises(JudgeError, match="timeout after 0.2 s"):
        await ruler_score_group(make_group([0.3, 0.6]), "judge", backoff_s=0.0,
                                extra_litellm_params={"api_base": judge_server.url, "timeout": 0.2, "num_retries": 0})


async def test_litellms_own_call_settings_are_named_not_sent(judge_server, clean_env):
    with pytest.warns(gw.ArtCompatWarning, match="drop_params"):
        await ruler_score_group(make_group([0.3, 0.6]), "judge", backoff_s=0.0,
                                extra_litellm_params={"api_base": judge_server.url, "drop_params": True,
                                                      "top_p": 0.5})
    request = judge_server.requests[-1]
    assert "drop_params" not in request and request["top_p"] == 0.5  # a provider option is sent as before


async def test_openrouters_attribution_headers(judge_server, clean_env):
    clean_env.setenv("OPENROUTER_API_BASE", judge_server.url)
    clean_env.setenv("OR_API_KEY", "sk-or")
    clean_env.setenv("OR_SITE_URL", "https://example.org")
    clean_env.setenv("OR_APP_NAME", "my-agent")
    await ruler_score_group(make_group([0.3, 0.6]), "openrouter/qwen/qwen3-32b", backoff_s=0.0)
    headers = judge_server.headers[-1]
    assert (headers["http-referer"], headers["x-title"], headers["authorization"]) == (
        "https://example.org", "my-agent", "Bearer sk-or")


def _closed_port_url() -> str:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    return f"http://127.0.0.1:{port}"


async def test_a_local_judge_that_cannot_be_reached_is_loud_and_names_what_chose_it(clean_env):
    url = _closed_port_url()
    clean_env.setenv("OLLAMA_API_BASE", url)
    # the program's local judge stays the one it named: never the hosted default
    assert providers.resolve("ollama/qwen3").base_url == url + "/v1"
    with pytest.raises(JudgeUnreachableError, match=r"cannot reach http://127\.0\.0\.1:\d+/v1 \(chosen by \$OLLAMA_API_BASE\)"):
        await ruler_score_group(make_group([0.3, 0.6]), "ollama/qwen3", backoff_s=0.0, retries=1)
    # ART's swallow_exceptions=True drops the group, as ART's; that every group goes is said, once
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(3):
            assert await ruler_score_group(make_group([0.3, 0.6]), "ollama/qwen3", backoff_s=0.0, retries=0,
                                           swallow_exceptions=True) is None
    said = [str(w.message) for w in caught if issubclass(w.category, GroupwiseWarning)]
    assert len(said) == 1 and "EVERY group" in said[0] and "$OLLAMA_API_BASE" in said[0]
