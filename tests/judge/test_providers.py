"""RULER's judge names: each provider prefix reaches its OpenAI-compatible endpoint with its key and the
model name after the prefix; self-hosted servers by base URL; a clear error listing the prefixes;
swallow_exceptions drops every failure and counts it. All against a real local HTTP server."""

from __future__ import annotations

import dataclasses

import pytest

import groupwise as gw
from groupwise.judge import judge_stats, providers, ruler_score_group


def make_group(qualities) -> gw.TrajectoryGroup:
    """Trajectories the scripted judge scores by the ``quality=`` written in their answer."""
    task = [{"role": "user", "content": "What is 6 x 7?"}]
    return gw.TrajectoryGroup([gw.Trajectory(messages_and_choices=[*task, {"role": "assistant", "content": f"quality={q}"}])
                               for q in qualities])


@pytest.mark.parametrize("judge_model,key_var,sent,response_format", [
    ("anthropic/claude-sonnet-4-20250514", "ANTHROPIC_API_KEY", "claude-sonnet-4-20250514", None),
    ("gemini/gemini-2.5-flash", "GEMINI_API_KEY", "gemini-2.5-flash", "json_schema"),
    ("together_ai/Qwen/Qwen3-32B", "TOGETHER_API_KEY", "Qwen/Qwen3-32B", "json_schema"),
    ("together/Qwen/Qwen3-32B", "TOGETHERAI_API_KEY", "Qwen/Qwen3-32B", "json_schema"),
    ("groq/llama-3.3-70b-versatile", "GROQ_API_KEY", "llama-3.3-70b-versatile", "json_object"),
    ("openrouter/qwen/qwen3-32b", "OPENROUTER_API_KEY", "qwen/qwen3-32b", "json_schema"),
])
async def test_each_provider_prefix_reaches_its_endpoint_with_its_key(judge_server, monkeypatch, judge_model,
                                                                      key_var, sent, response_format):
    name = providers.ALIASES.get(judge_model.split("/")[0], judge_model.split("/")[0])
    # the table's URL of this provider, pointed at the local server (the seam: no network in tests)
    monkeypatch.setitem(providers.PROVIDERS, name, dataclasses.replace(providers.PROVIDERS[name], base_url=judge_server.url))
    for var in providers.PROVIDERS[name].key_vars:
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv(key_var, "sk-provider")
    judged = await ruler_score_group(make_group([0.2, 0.9]), judge_model, backoff_s=0.0)
    assert [t.reward for t in judged.trajectories] == [0.2, 0.9]
    request = judge_server.requests[-1]
    assert request["model"] == sent
    assert judge_server.headers[-1]["authorization"] == "Bearer sk-provider"
    assert (request.get("response_format") or {}).get("type") == response_format


async def test_self_hosted_vllm_or_sglang_by_environment_or_base_url(judge_server, monkeypatch):
    monkeypatch.setenv("HOSTED_VLLM_API_BASE", judge_server.url)
    monkeypatch.delenv("HOSTED_VLLM_API_KEY", raising=False)
    judged = await ruler_score_group(make_group([0.3, 0.6]), "hosted_vllm/Qwen/Qwen3-32B", backoff_s=0.0)
    assert judged is not None and judge_server.requests[-1]["model"] == "Qwen/Qwen3-32B"
    assert judge_server.headers[-1]["authorization"] == "Bearer EMPTY"  # no key needed
    # sglang/ is an alias; ART's extra_litellm_params api_base is the base URL (no key variable needed)
    monkeypatch.delenv("HOSTED_VLLM_API_BASE")
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    await ruler_score_group(make_group([0.3, 0.6]), "sglang/my-model", backoff_s=0.0,
                            extra_litellm_params={"api_base": judge_server.url})
    await ruler_score_group(make_group([0.3, 0.6]), "anthropic/claude-proxy", backoff_s=0.0,
                            extra_litellm_params={"api_base": judge_server.url})
    assert [r["model"] for r in judge_server.requests[-2:]] == ["my-model", "claude-proxy"]
    with pytest.raises(gw.ConfigError, match="HOSTED_VLLM_API_BASE"):
        await ruler_score_group(make_group([0.3, 0.6]), "hosted_vllm/x")


async def test_unknown_prefix_lists_the_accepted_ones():
    with pytest.raises(gw.ConfigError) as err:
        await ruler_score_group(make_group([0.3, 0.6]), "bedrock/claude")
    text = str(err.value)
    for prefix in ("anthropic", "gemini", "together_ai", "groq", "openrouter", "hosted_vllm", "ollama", "openai"):
        assert prefix in text
    assert "base_url=" in text


async def test_swallow_exceptions_drops_every_failure_and_counts_it(judge_server, monkeypatch):
    before = judge_stats.dropped_groups
    monkeypatch.delenv("GEMINI_API_KEY", raising=False)
    monkeypatch.delenv("GOOGLE_API_KEY", raising=False)
    assert await ruler_score_group(make_group([0.3, 0.6]), "gemini/x", swallow_exceptions=True) is None  # no key
    assert await ruler_score_group(make_group([0.3, 0.6]), "bedrock/x", swallow_exceptions=True) is None  # unknown
    judge_server.then(status=400)
    assert await ruler_score_group(make_group([0.3, 0.6]), "judge", base_url=judge_server.url,
                                   swallow_exceptions=True) is None  # refused
    assert judge_stats.dropped_groups == before + 3
    assert [e.split(":")[0] for e in list(judge_stats.last_errors)[-3:]] == ["JudgeError", "ConfigError", "JudgeError"]


def test_a_client_of_an_engine_served_in_process_is_a_local_judge():
    import httpx

    from groupwise.inference.client import BASE_URL

    assert httpx.URL(BASE_URL).host == providers.IN_PROCESS_HOST  # the judge does not import inference/
    import openai

    local = providers.resolve("m", client=openai.AsyncOpenAI(base_url=BASE_URL, api_key="x"))
    remote = providers.resolve("m", client=openai.AsyncOpenAI(base_url="http://127.0.0.1:9/v1", api_key="x"))
    assert local.local and not remote.local


def test_client_factories_serve_their_prefix_and_name_the_missing_extra(monkeypatch):
    # the registry the judge looks "local/<model>" up in: a factory (or "module:function") per prefix
    import openai

    from groupwise.errors import MissingDependencyError

    monkeypatch.setattr(providers, "CLIENT_FACTORIES", dict(providers.CLIENT_FACTORIES))
    made = []

    def factory(model):
        made.append(model)
        return openai.AsyncOpenAI(base_url=f"http://{providers.IN_PROCESS_HOST}/v1", api_key="x")

    providers.register_client_factory("mine", factory)
    endpoint = providers.resolve("mine/some/model")
    assert made == ["some/model"] and endpoint.model == "some/model" and endpoint.local
    assert providers.CLIENT_FACTORIES["local"] == "groupwise.backend.judges:local_judge_client"
    providers.register_client_factory("local", "groupwise_no_such_module:client")
    with pytest.raises(MissingDependencyError, match=r"pip install 'groupwise\[backend\]'"):
        providers.resolve("local/smollm2-135m")


async def test_litellm_names_art_programs_use_ollama_by_host_and_bare_openai_names(judge_server, monkeypatch):
    # ART hands these to LiteLLM: Ollama's api_base is the host (LiteLLM adds the route), and OpenAI's and
    # Anthropic's own model names need no prefix
    host = judge_server.url.removesuffix("/v1")
    await ruler_score_group(make_group([0.3, 0.6]), "ollama/qwen3:30b-a3b", backoff_s=0.0,
                            extra_litellm_params={"api_base": host})
    assert judge_server.requests[-1]["model"] == "qwen3:30b-a3b"
    monkeypatch.setenv("OPENAI_BASE_URL", judge_server.url)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-openai")
    for name in ("o4-mini", "gpt-4.1", "o3"):
        judged = await ruler_score_group(make_group([0.2, 0.9]), name, backoff_s=0.0)
        assert [t.reward for t in judged.trajectories] == [0.2, 0.9] and judge_server.requests[-1]["model"] == name
    monkeypatch.setitem(providers.PROVIDERS, "anthropic",
                        dataclasses.replace(providers.PROVIDERS["anthropic"], base_url=judge_server.url))
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-anthropic")
    await ruler_score_group(make_group([0.2, 0.9]), "claude-sonnet-4-5", backoff_s=0.0)
    assert judge_server.headers[-1]["authorization"] == "Bearer sk-anthropic"
    with pytest.raises(gw.ConfigError, match="names no provider"):
        await ruler_score_group(make_group([0.3, 0.6]), "my-own-model")
