"""vLLM's runtime LoRA routes on `groupwise serve --lora-routes`: ``POST /v1/load_lora_adapter`` and
``POST /v1/unload_lora_adapter``, with vLLM's bodies (``{"lora_name", "lora_path"}``, ``{"lora_name"}``)
and its plain-text success answers, so a script written for a vLLM server loads adapters here too.

Off unless asked for, as on vLLM (its ``VLLM_ALLOW_RUNTIME_LORA_UPDATING``): a client that may use the
model could then make the server read any LoRA folder of its machine. A name ``<served name>@<step>`` is
that step of the served model (``name`` then means it when it is the latest); any other name serves the
folder under that name. With several frontends (inference/frontends.py) the load goes to the one engine
core and every frontend serves it (registry.CoreRegistry).
"""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import PlainTextResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from groupwise.core.adapter_names import split_served_name
from groupwise.inference.adapter_folder import AdapterFolderError, checked_copy
from groupwise.inference.requests import EngineError
from groupwise.inference.server import (ApiError, ServerState, check_content_type, current_state, read_body,
                                       require_key, server_state)

__all__ = ["MAX_CLIENT_ADAPTERS", "LoadLoraAdapter", "UnloadLoraAdapter", "lora_routes"]

# The most adapters the engine holds for a load through these routes to be taken: each holds a slot's
# weights (adapter_slots.py) for good, so a client looping over new names would fill the memory of the one
# core every frontend feeds. Past it a load is refused (409) until one is unloaded.
MAX_CLIENT_ADAPTERS = 64

lora_routes = APIRouter(prefix="/v1", dependencies=[Depends(require_key)], include_in_schema=False)


class LoadLoraAdapter(BaseModel):
    model_config = ConfigDict(extra="ignore")  # vLLM's load_inplace and the like: not used here
    lora_name: str = Field(min_length=1, max_length=256)
    lora_path: str = Field(min_length=1, max_length=4096)

    @field_validator("lora_name")
    @classmethod
    def printable(cls, name: str) -> str:
        """A name a log line, an error message and a client's model field show as it is."""
        if not name.isprintable() or name != name.strip():
            raise ValueError("must be printable, without control characters or surrounding whitespace")
        return name


class UnloadLoraAdapter(BaseModel):
    model_config = ConfigDict(extra="ignore")  # vLLM's lora_int_id
    lora_name: str = Field(min_length=1, max_length=256)


def parsed(model: type[BaseModel]) -> Any:
    """A dependency: the body read within the server's limits and validated as `model`; a 400 naming the field."""

    async def dependency(request: Request) -> Any:
        state = server_state(request)
        check_content_type(request)
        raw = await read_body(request, state.max_body_bytes, state.body_timeout_s)
        try:
            return model.model_validate_json(raw)
        except ValidationError as exc:
            first = exc.errors(include_url=False, include_input=False)[0]
            field = ".".join(str(part) for part in first["loc"])
            raise ApiError(400, f"{field}: {first['msg']}" if field else f"invalid request: {first['msg']}",
                           param=field or None) from None

    return dependency


def _step_of(state: ServerState, name: str) -> tuple[str, int] | None:
    """(model, step) when `name` is ``<a served model>@<step>``, else None (a plain name)."""
    model, step = split_served_name(name)
    if step.isascii() and step.isdigit() and len(step) <= 18 and step == str(int(step)) and state.registry.steps(model):
        return model, int(step)
    return None


@lora_routes.post("/load_lora_adapter")
async def load_lora_adapter(body: LoadLoraAdapter = Depends(parsed(LoadLoraAdapter)),
                            state: ServerState = Depends(current_state)) -> Any:
    registry = state.registry
    await asyncio.to_thread(registry.refresh)
    if body.lora_name in registry.served_ids():
        raise ApiError(400, f"the LoRA adapter {body.lora_name!r} is already loaded; unload it first "
                       "(POST /v1/unload_lora_adapter)", param="lora_name", code="adapter_exists")
    step = _step_of(state, body.lora_name)
    if step is not None and step[1] == 0:
        raise ApiError(400, f"{body.lora_name!r} is the base model (step 0); name the adapter's step from 1",
                       param="lora_name")

    if len(state.engine.adapters()) >= MAX_CLIENT_ADAPTERS:
        raise ApiError(409, f"this server holds {MAX_CLIENT_ADAPTERS} LoRA adapters, the most a load through "
                       "these routes may add to; unload one first (POST /v1/unload_lora_adapter)",
                       param="lora_name", code="too_many_adapters")

    def load() -> None:
        with checked_copy(body.lora_path) as folder:  # the engine loads a checked private copy (adapter_folder.py)
            if step is not None:
                registry.add_step(step[0], step[1], folder)
            else:
                registry.add_alias(body.lora_name, folder)

    try:
        await asyncio.to_thread(load)
    except AdapterFolderError as exc:
        raise ApiError(400, f"the LoRA adapter {body.lora_name!r} is not loaded from {body.lora_path[:200]!r}: {exc}",
                       param="lora_path", code="adapter_load_failed") from None
    except Exception as exc:  # the engine's refusal or a folder that is no peft LoRA: the caller's to fix
        raise ApiError(400, f"the LoRA adapter {body.lora_name!r} could not be loaded from {body.lora_path!r}: "
                       f"{exc}", param="lora_path", code="adapter_load_failed") from None
    return PlainTextResponse(f"Success: LoRA adapter '{body.lora_name}' added successfully.")


@lora_routes.post("/unload_lora_adapter")
async def unload_lora_adapter(body: UnloadLoraAdapter = Depends(parsed(UnloadLoraAdapter)),
                              state: ServerState = Depends(current_state)) -> Any:
    registry = state.registry
    await asyncio.to_thread(registry.refresh)
    if body.lora_name not in registry.served_ids():
        raise ApiError(404, f"the LoRA adapter {body.lora_name!r} is not loaded; loaded: {registry.served_ids()}",
                       param="lora_name", code="adapter_not_found")
    step = _step_of(state, body.lora_name)
    if (step is not None and step[1] == 0) or (step is None and registry.resolve(body.lora_name).adapter is None):
        raise ApiError(400, f"{body.lora_name!r} is the base model, which cannot be unloaded", param="lora_name")
    # Freed first, named second: an adapter that requests still use stays served, under its name, in every
    # frontend, and the caller hears why (the registry alone would drop the name and free it later).
    adapter = registry.resolve(body.lora_name).adapter

    def forget() -> None:
        if step is not None:
            registry.remove_step(*step)
        else:
            registry.remove_alias(body.lora_name)

    try:
        await asyncio.to_thread(state.engine.remove_adapter, adapter)
    except EngineError as exc:
        await asyncio.to_thread(registry.refresh)
        if adapter not in state.engine.adapters():  # another unload (any frontend) took it first
            await asyncio.to_thread(forget)
            raise ApiError(404, f"the LoRA adapter {body.lora_name!r} is not loaded: it was unloaded meanwhile",
                           param="lora_name", code="adapter_not_found") from None
        raise ApiError(409, f"the LoRA adapter {body.lora_name!r} stays loaded: {exc}", param="lora_name",
                       code="adapter_in_use") from None
    await asyncio.to_thread(forget)
    return PlainTextResponse(f"Success: LoRA adapter '{body.lora_name}' removed successfully.")
