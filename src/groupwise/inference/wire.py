"""The messages between an engine core process and its frontends (engine_core.py, engine_client.py).

Typed msgspec Structs, encoded as MessagePack arrays (``array_like``: no field names on the wire): a
request is its token ids, its sampling settings and its adapter's name, so the core never parses JSON,
renders a chat or builds a response; the frontend tokenises before and turns token ids into text and
OpenAI's shapes after. A grammar crosses as its compiled source (llguidance's grammar text), which the
core builds a matcher factory of; adapter weights cross as safetensors bytes, or as a folder path.

Frontend -> core: `Hello` (first; its pid, which the core watches: a frontend that dies has its
requests freed), `AddRequest`, `Abort`, `PublishAdapter`, `RemoveAdapter`, `Retarget`, `Goodbye`,
`Shutdown`, `Status`. Core -> frontend: `Welcome` (the engine's limits, once per Hello), `Outputs` (every token
delta, finished and failed request gathered for this frontend since the last send: one message per
flush, not per token), `Reply` (to an adapter call), and `Adapters` (the served adapters and the
policy version, sent to every frontend whenever they change), `CoreStatus`.
"""

from __future__ import annotations

from typing import Union

import msgspec

__all__ = ["Abort", "AddRequest", "Adapters", "CompletionMsg", "Delta", "Failed", "Finished", "FromCore", "Goodbye",
           "Hello", "Outputs", "PublishAdapter", "RemoveAdapter", "Reply", "Retarget", "Sampling", "Shutdown",
           "Status", "ToCore", "Welcome", "CoreStatus", "decode_from_core", "decode_to_core", "encode"]


class Sampling(msgspec.Struct, array_like=True, frozen=True):
    """`SamplingParams` on the wire (sampling.py owns the fields' meaning and checks)."""

    temperature: float
    top_p: float
    seed: int | None
    top_logprobs: int
    top_k: int
    min_p: float
    repetition_penalty: float
    presence_penalty: float
    frequency_penalty: float


# ------------------------------------------------------------------------------------ frontend -> core


class Hello(msgspec.Struct, tag="hello", array_like=True):
    pid: int  # the frontend's process: the core frees its requests once it is gone


class AddRequest(msgspec.Struct, tag="add", array_like=True):
    request_id: int  # unique per frontend
    prompt_ids: list[int]
    sampling: Sampling
    max_new_tokens: int | None
    n: int
    stop: list[str]
    stop_token_ids: list[int]
    ignore_eos: bool
    adapter: str | None
    follow: str | None  # GenerationRequest.follow: the model whose latest policy the request follows
    grammar: str | None  # a compiled grammar's source (constrained.py), None: unconstrained
    grammar_description: str
    stream: bool  # send each sampled token as it comes (else only the finished request)


class Abort(msgspec.Struct, tag="abort", array_like=True):
    request_ids: list[int]


class PublishAdapter(msgspec.Struct, tag="publish", array_like=True):
    """Load adapter `name` (a policy version): a folder `path`, or `weights` (safetensors bytes of peft's
    state dict) with its peft `config` (its ``to_dict()``)."""

    call_id: int
    name: str
    path: str | None
    weights: bytes | None
    config: dict | None


class RemoveAdapter(msgspec.Struct, tag="remove", array_like=True):
    call_id: int
    name: str


class Retarget(msgspec.Struct, tag="retarget", array_like=True):
    call_id: int
    follow: str
    adapter: str


class Status(msgspec.Struct, tag="status", array_like=True):
    """Ask for the core's `CoreStatus`."""

    call_id: int


class Goodbye(msgspec.Struct, tag="bye", array_like=True):
    """The frontend closes: its requests are cancelled."""


class Shutdown(msgspec.Struct, tag="shutdown", array_like=True):
    """Stop the core process (its owner closing it)."""


ToCore = Union[Hello, AddRequest, Abort, PublishAdapter, RemoveAdapter, Retarget, Status, Goodbye, Shutdown]

# ------------------------------------------------------------------------------------ core -> frontend


class Welcome(msgspec.Struct, tag="welcome", array_like=True):
    core_pid: int
    context_length: int
    vocab_size: int
    max_batch_size: int
    max_new_tokens_default: int
    kv_budget_limits_context: bool
    adapters: list[str]
    version: int


class Delta(msgspec.Struct, array_like=True):
    """Tokens sampled for choice `index` of request `request_id` since the last send."""

    request_id: int
    index: int
    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str | None


class CompletionMsg(msgspec.Struct, array_like=True):
    """`Completion` on the wire (requests.py)."""

    index: int
    token_ids: list[int]
    logprobs: list[float]
    top_logprobs: list[list[tuple[int, float]]]
    text: str
    finish_reason: str
    forced_indices: list[int]
    adapters: list[str | None]


class Finished(msgspec.Struct, array_like=True):
    request_id: int
    completions: list[CompletionMsg]
    prompt_tokens: int
    adapter: str | None


class Failed(msgspec.Struct, array_like=True):
    request_id: int
    kind: str  # "invalid", "prompt_too_long", "memory" (RequestMemoryError), "request_failed", "engine"
    message: str


class Outputs(msgspec.Struct, tag="out", array_like=True):
    deltas: list[Delta]
    finished: list[Finished]
    failed: list[Failed]


class Reply(msgspec.Struct, tag="reply", array_like=True):
    call_id: int
    error: str | None  # the call's EngineError message, None when it succeeded
    result: int | None  # Retarget: how many requests moved


class Adapters(msgspec.Struct, tag="adapters", array_like=True):
    """The adapters the core serves after a change, and the policy version (+1 per change)."""

    adapters: list[str]
    version: int


class CoreStatus(msgspec.Struct, tag="core_status", array_like=True):
    """What the core holds now: its frontends, and the engine's queued and running requests."""

    call_id: int
    frontends: int
    requests: int  # requests of frontends the core holds (queued or running)
    waiting: int
    running: int  # sequences decoding
    cancelled: int  # requests cancelled so far (aborted, or their frontend died)
    version: int
    added: dict[int, int] = {}  # each connected frontend's pid -> the requests it has sent (which frontends serve)


FromCore = Union[Welcome, Outputs, Reply, Adapters, CoreStatus]

_encoder = msgspec.msgpack.Encoder()
_to_core = msgspec.msgpack.Decoder(ToCore)
_from_core = msgspec.msgpack.Decoder(FromCore)


def encode(message: msgspec.Struct) -> bytes:
    return _encoder.encode(message)


def decode_to_core(data: bytes) -> ToCore:
    return _to_core.decode(data)


def decode_from_core(data: bytes) -> FromCore:
    return _from_core.decode(data)
