"""The engine core in a process of its own, fed by frontend processes over ZeroMQ.

Why. In one process, the Python that steps the engine shares one GIL with every request's HTTP and SDK
work, chat template, tokenising, detokenising and response building: on a GPU that per-request Python,
not the forward passes, bounds tokens/s. So the engine (its scheduler, model, KV cache and adapter
slots) can run here, in a process that does nothing else, and every frontend (the HTTP server, the
in-process clients of rollouts: engine_client.py) owns its requests' Python. Requests cross as token
ids, sampling settings and adapter names (wire.py); the core never parses JSON or renders a chat.

The process. Two threads, as the engine already runs in any process: the compute thread
(groupwise/runtime/compute.py) steps the engine back to back while it has work; this module's I/O thread
(the main thread) owns the ROUTER socket. It waits on the socket and on a pipe that the compute thread
writes when tokens or results are ready, so it costs nothing while idle (on a 2-core CPU a spinning
poll would take a core from the forward passes), drains every message that arrived, and sends each
frontend ONE `Outputs` message with everything gathered for it since the last send.

Frontends. Each is a DEALER whose identity keys its requests; its `Hello` names its pid. Every
`LIVENESS_S` the core checks those pids: a frontend that died (SIGKILL included: no goodbye) has its
requests cancelled in the engine, which frees their KV slots at its next step; the other frontends go
on. The core's owner (the process that started it) is watched the same way: when it is gone the core
exits, so a killed server leaves no engine holding the GPU. A frontend learns of the core's death from
the core's pid (engine_client.py) and fails its requests with the exit code.

`python -m groupwise.inference.engine_core` reads a `CoreSpec` (msgpack) on stdin: the model, its
device, dtype and engine settings, the socket address and the owner's pid.
"""

from __future__ import annotations

import concurrent.futures
import importlib
import os
import sys
import threading
import time
from typing import Any, NamedTuple

import msgspec

from groupwise.config import DEFAULT_ENGINE_PROCESS, DEFAULT_FRONTENDS, ENGINE_PROCESS_CHOICES, frontends_problem
from groupwise.errors import ConfigError
from groupwise.inference import wire
from groupwise.runtime.compute import usable_cores

__all__ = ["LIVENESS_S", "MAX_AUTO_FRONTENDS", "CoreSpec", "EngineCoreServer", "Placement", "pid_exit",
           "remove_core_address", "resolve_engine_process", "run_core"]

LIVENESS_S = 0.2  # how often the core checks its frontends' and owner's pids (a dead one's requests are freed)


class Placement(NamedTuple):
    """Where `groupwise serve` runs its engine: ``mode`` ``"in_process"`` (the one server process steps
    it) or ``"separate"`` (a core process fed by ``frontends`` frontend processes, inference/frontends.py)."""

    mode: str
    frontends: int


MAX_AUTO_FRONTENDS = 4  # the most frontends measured (below): "auto" picks no more


def resolve_engine_process(choice: str | None, device_type: str, frontends: str | int | None = None, *,
                           cpus: int | None = None) -> Placement:
    """Where the engine runs for the settings `choice` (engine_process; None: the default) and `frontends`
    (None: the default) on a device of `device_type`, with `cpus` CPUs this process may use (default: its
    affinity). A number of frontends is obeyed (more than one needs the core separate); "auto" decides by
    what was measured:

    * On the CPU: in process. The engine's own forward passes are the bound, and a second process only
      adds the socket hop and a second interpreter on the same cores (docs/benchmarks.md).
    * On CUDA: a separate core with min(4, CPUs - 1) frontends. The per-request Python is the bound there,
      and one process runs all of it under one GIL: measured on an H200 at 256 concurrent chats, one
      frontend with the core separate made 0.94x-1.24x of the in-process app's tokens/s, two 1.63x and
      four 1.98x. Each frontend is a busy interpreter, so one CPU is left to the core; more than four is
      not measured (the gain from two to four was already smaller than from one to two)."""
    choice = choice or DEFAULT_ENGINE_PROCESS
    if choice not in ENGINE_PROCESS_CHOICES:
        raise ConfigError(f"engine_process={choice!r} must be one of {list(ENGINE_PROCESS_CHOICES)}",
                          what="engine_process")
    wanted = DEFAULT_FRONTENDS if frontends is None else str(frontends)
    if (problem := frontends_problem(wanted)) is not None:
        raise ConfigError(f"frontends {problem}", what="frontends")
    if wanted != "auto":
        count = int(wanted)
        if choice == "in_process":
            if count > 1:
                raise ConfigError(f"frontends={count} needs the engine in a core process of its own: drop "
                                  "--engine-process in_process (or pass --frontends 1)", what="frontends")
            return Placement("in_process", 1)
        return Placement("separate", count)
    several = device_type == "cuda"
    if choice == "auto":
        choice = "separate" if several else "in_process"
    if choice == "in_process" or not several:
        return Placement(choice, 1)
    if cpus is None:
        cpus = usable_cores()
    return Placement("separate", max(1, min(MAX_AUTO_FRONTENDS, cpus - 1)))


def remove_core_address(address: str) -> None:
    """Remove an ipc:// address's socket and its private folder (engine_client.new_core_address). The core
    does it when it closes; a frontend does it for a core that died without closing (SIGKILL, the OOM
    killer), so crashes leave no folders behind in the temp dir. Other addresses are left alone."""
    if not address.startswith("ipc://"):
        return
    path = address[len("ipc://"):]
    for target, remove in ((path, os.unlink), (os.path.dirname(path), os.rmdir)):
        try:
            remove(target)
        except OSError:  # removed already (zmq, another frontend), or the folder holds more than the socket
            pass


def pid_exit(pid: int) -> tuple[bool, int | None]:
    """(alive, exit status) of process `pid` without being its parent: a zombie is dead, and its exit
    status (waitpid's, from /proc: a signal in the low 7 bits) is known until its parent reaps it."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except FileNotFoundError:
        return False, None
    except OSError:  # not Linux: only whether it exists
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False, None
        except PermissionError:
            pass
        return True, None
    fields = stat[stat.rindex(b")") + 2:].split()  # after "pid (comm) ": the state is first
    if fields[0] in (b"Z", b"X"):
        status = int(fields[49]) if len(fields) > 49 else None  # field 52 of proc(5): exit_code
        return False, status
    return True, None


class CoreSpec(msgspec.Struct):
    """What the core process builds: the model (a short name, HF id or folder; or `load_model`, a
    ``module:function`` taking ``(model, device=, dtype=)`` and returning (model, tokenizer)), its
    engine's settings, the socket it binds and the pid of its owner (it exits when the owner is gone)."""

    model: str
    address: str
    owner_pid: int
    device: str | None = None
    dtype: str | None = None
    engine_kwargs: dict = {}
    max_kv_gb: float | None = None  # as `groupwise serve --max-kv-gb`: None sizes it from free memory
    load_model: str | None = None


class _Request:
    """A request of one frontend in the engine: its future and its tokens not yet sent."""

    __slots__ = ("frontend", "request_id", "future", "stream")

    def __init__(self, frontend: bytes, request_id: int, future: concurrent.futures.Future, stream: bool):
        self.frontend, self.request_id, self.future, self.stream = frontend, request_id, future, stream


class EngineCoreServer:
    """An `Engine` served to frontends over a ZeroMQ ROUTER socket bound at `address` (module doc).
    `run()` serves on the calling thread until `Shutdown`, the owner's death or `stop()`."""

    def __init__(self, engine: Any, address: str, *, owner_pid: int | None = None) -> None:
        import zmq

        self.engine = engine
        self.owner_pid = owner_pid
        self._ctx = zmq.Context()
        self._sock = self._ctx.socket(zmq.ROUTER)
        self._sock.setsockopt(zmq.LINGER, 0)
        self.address = address
        self._sock.bind(address)
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_w, False)
        os.set_blocking(self._wake_r, False)
        self._lock = threading.Lock()  # guards what the compute thread fills and the I/O thread sends
        self._deltas: dict[tuple[bytes, int, int], wire.Delta] = {}
        self._finished: dict[bytes, list[wire.Finished]] = {}
        self._failed: dict[bytes, list[wire.Failed]] = {}
        self._woken = False
        self._requests: dict[tuple[bytes, int], _Request] = {}
        self._frontends: dict[bytes, int] = {}  # identity -> pid
        self._added: dict[bytes, int] = {}  # identity -> requests it sent (CoreStatus.added)
        self._version = 0  # the policy version: +1 per adapter change
        self._announced = self._engine_adapters()  # the adapter set the frontends were last told of
        self._stop = False
        self._closed = False  # the wake pipe is closed: the compute thread writes to it no more

    # ------------------------------------------------------------------------ the compute thread's side
    def _wake(self) -> None:
        """Called under the lock: tell the I/O thread there is something to send (once per send)."""
        if not self._woken and not self._closed:
            self._woken = True
            try:
                os.write(self._wake_w, b"x")
            except BlockingIOError:  # the pipe is full of wake-ups the I/O thread has not read: it will
                pass

    def _on_token(self, frontend: bytes, request_id: int) -> Any:
        def on_token(index: int, token: int, logprob: float, finish: str | None) -> None:
            key = (frontend, request_id, index)
            with self._lock:
                delta = self._deltas.get(key)
                if delta is None:
                    delta = self._deltas[key] = wire.Delta(request_id, index, [], [], None)
                delta.token_ids.append(token)
                delta.logprobs.append(logprob)
                delta.finish_reason = finish
                self._wake()
        return on_token

    def _on_done(self, request: _Request) -> Any:
        def on_done(future: concurrent.futures.Future) -> None:
            from groupwise.inference.requests import PromptTooLongError, RequestFailedError, RequestMemoryError

            with self._lock:
                self._requests.pop((request.frontend, request.request_id), None)
                if future.cancelled():  # aborted, or its frontend went away: nobody to answer
                    return
                exc = future.exception()
                if exc is None:
                    self._finished.setdefault(request.frontend, []).append(_finished(request.request_id, future.result()))
                else:
                    kind = ("request_failed" if isinstance(exc, RequestFailedError) else
                            "prompt_too_long" if isinstance(exc, PromptTooLongError) else
                            "memory" if isinstance(exc, RequestMemoryError) else "engine")
                    self._failed.setdefault(request.frontend, []).append(wire.Failed(request.request_id, kind, str(exc)))
                self._wake()
        return on_done

    # ------------------------------------------------------------------------ the I/O thread
    def run(self) -> None:
        import zmq

        poller = zmq.Poller()
        poller.register(self._sock, zmq.POLLIN)
        poller.register(self._wake_r, zmq.POLLIN)
        next_check = time.monotonic() + LIVENESS_S
        try:
            while not self._stop:
                poller.poll(timeout=max(0.0, next_check - time.monotonic()) * 1000)
                try:
                    os.read(self._wake_r, 4096)
                except BlockingIOError:
                    pass
                while not self._stop:
                    try:
                        frames = self._sock.recv_multipart(zmq.NOBLOCK)
                    except zmq.Again:
                        break
                    self._handle(frames[0], frames[-1])
                self._flush()
                if time.monotonic() >= next_check:
                    self._check_liveness()
                    next_check = time.monotonic() + LIVENESS_S
        finally:
            self._close()

    def stop(self) -> None:
        self._stop = True
        with self._lock:
            self._woken = False
            self._wake()

    def _send(self, frontend: bytes, message: msgspec.Struct) -> None:
        import zmq

        try:
            self._sock.send_multipart([frontend, wire.encode(message)], zmq.NOBLOCK)
        except zmq.Again:  # a frontend that reads nothing (its queue is full): its outputs are dropped
            pass

    def _engine_adapters(self) -> list[str]:
        """The engine's adapters, read from this thread while another may load one (a set that changes
        size mid-read raises: read it again)."""
        while True:
            try:
                return self.engine.adapters()
            except RuntimeError:
                continue

    def _announce_adapters(self) -> None:
        """Tell every frontend the adapter set (and a new policy version) when it changed outside a
        frontend's call: a backend worker (backend/worker.py) loads and drops its trained steps' adapters
        on the engine directly, in this process, and the frontends check a request's adapter against
        the set they were told of."""
        adapters = self._engine_adapters()
        if adapters == self._announced:
            return
        self._announced = adapters
        self._version += 1
        update = wire.Adapters(adapters, self._version)
        for frontend in self._frontends:
            self._send(frontend, update)

    def _flush(self) -> None:
        self._announce_adapters()
        with self._lock:
            deltas, self._deltas = self._deltas, {}
            finished, self._finished = self._finished, {}
            failed, self._failed = self._failed, {}
            self._woken = False
        by_frontend: dict[bytes, wire.Outputs] = {}
        for (frontend, _, _), delta in deltas.items():
            by_frontend.setdefault(frontend, wire.Outputs([], [], [])).deltas.append(delta)
        for frontend, items in finished.items():
            by_frontend.setdefault(frontend, wire.Outputs([], [], [])).finished.extend(items)
        for frontend, items in failed.items():
            by_frontend.setdefault(frontend, wire.Outputs([], [], [])).failed.extend(items)
        for frontend, outputs in by_frontend.items():
            if frontend in self._frontends:
                self._send(frontend, outputs)

    def _handle(self, frontend: bytes, data: bytes) -> None:
        try:
            message = wire.decode_to_core(data)
        except msgspec.DecodeError as exc:  # a peer that speaks another version: say so, keep serving
            print(f"engine core: dropped an undecodable message from {frontend!r}: {exc}", file=sys.stderr)
            return
        if isinstance(message, wire.AddRequest):
            self._add(frontend, message)
        elif isinstance(message, wire.Abort):
            self._abort(frontend, message.request_ids)
        elif isinstance(message, wire.Hello):
            self._frontends[frontend] = message.pid
            e = self.engine
            self._send(frontend, wire.Welcome(os.getpid(), e.context_length, e.vocab_size, e.max_batch_size,
                                              e.max_new_tokens_default, e.kv_budget_limits_context,
                                              e.adapters(), self._version))
        elif isinstance(message, (wire.PublishAdapter, wire.RemoveAdapter, wire.Retarget)):
            self._adapter_call(frontend, message)
        elif isinstance(message, wire.Status):
            # before the answer, on the same connection: a frontend whose status call returned knows
            # every adapter the engine held when it asked (backend/frontends.py waits on that)
            self._announce_adapters()
            st = self.engine.state
            with st.cv:
                waiting, running = len(st.waiting), len(st.running)
            with self._lock:
                held = len(self._requests)
            added = {pid: self._added.get(f, 0) for f, pid in self._frontends.items()}
            self._send(frontend, wire.CoreStatus(message.call_id, len(self._frontends), held, waiting, running,
                                                 self.engine.stats.cancelled_requests, self._version, added))
        elif isinstance(message, wire.Goodbye):
            self._drop_frontend(frontend)
        elif isinstance(message, wire.Shutdown):
            self._stop = True

    def _add(self, frontend: bytes, m: wire.AddRequest) -> None:
        from groupwise.inference.requests import EngineError, GenerationRequest, PromptTooLongError, RequestMemoryError
        from groupwise.inference.sampling import SamplingParams

        if frontend not in self._frontends:
            return  # a frontend the core dropped as dead (its pid was reused?) gets nothing
        self._added[frontend] = self._added.get(frontend, 0) + 1
        constraint = None
        try:
            if m.grammar is not None:
                from groupwise.inference.constrained import Constraint

                constraint = Constraint(m.grammar, self.engine.tokenizer, m.grammar_description)
            req = GenerationRequest(
                prompt_ids=m.prompt_ids, max_new_tokens=m.max_new_tokens, sampling=SamplingParams(**msgspec.structs.asdict(m.sampling)),
                n=m.n, stop=m.stop, stop_token_ids=m.stop_token_ids, ignore_eos=m.ignore_eos, adapter=m.adapter,
                constraint=constraint, follow=m.follow,
                on_token=self._on_token(frontend, m.request_id) if m.stream else None)
            future = self.engine.submit(req)
        except Exception as exc:  # the engine's checks: the frontend raises them as the engine would have
            kind = "prompt_too_long" if isinstance(exc, PromptTooLongError) else "memory" if isinstance(
                exc, RequestMemoryError) else ("invalid" if isinstance(exc, (EngineError, ValueError)) else "engine")
            with self._lock:
                self._failed.setdefault(frontend, []).append(wire.Failed(m.request_id, kind, str(exc)))
            return
        request = _Request(frontend, m.request_id, future, m.stream)
        with self._lock:
            self._requests[(frontend, m.request_id)] = request
        future.add_done_callback(self._on_done(request))

    def _abort(self, frontend: bytes, request_ids: list[int]) -> None:
        with self._lock:
            found = [self._requests.get((frontend, rid)) for rid in request_ids]
        for request in found:
            if request is not None:
                request.future.cancel()  # the engine drops it at its next step (Engine._sweep_cancelled)

    def _drop_frontend(self, frontend: bytes) -> None:
        self._frontends.pop(frontend, None)
        self._added.pop(frontend, None)
        with self._lock:
            mine = [rid for (f, rid) in self._requests if f == frontend]
        self._abort(frontend, mine)

    def _check_liveness(self) -> None:
        if self.owner_pid is not None and not pid_exit(self.owner_pid)[0]:
            print(f"engine core: its owner (pid {self.owner_pid}) is gone; stopping", file=sys.stderr)
            self._stop = True
            return
        for frontend, pid in list(self._frontends.items()):
            if not pid_exit(pid)[0]:
                self._drop_frontend(frontend)

    def _adapter_call(self, frontend: bytes, m: Any) -> None:
        result, error = None, None
        try:
            if isinstance(m, wire.PublishAdapter):
                weights = config = None
                if m.weights is not None:
                    weights, config = _weights_from_wire(m.weights, m.config)
                self.engine.add_adapter(m.name, m.path, weights=weights, config=config)
            elif isinstance(m, wire.RemoveAdapter):
                self.engine.remove_adapter(m.name)
            else:
                result = self.engine.retarget(m.follow, m.adapter)
        except Exception as exc:  # the engine's refusal (EngineError) or a bad folder: the caller raises it
            error = f"{type(exc).__name__}: {exc}" if not hasattr(exc, "problems") else str(exc)
        if error is None and not isinstance(m, wire.Retarget):
            # Every frontend learns the new adapter set (and policy version) before the caller's reply:
            # one DEALER connection keeps order, so the caller's mirror is current when its call returns.
            self._version += 1
            self._announced = self._engine_adapters()
            update = wire.Adapters(self._announced, self._version)
            for other in self._frontends:
                self._send(other, update)
        self._send(frontend, wire.Reply(m.call_id, error, result))

    def _close(self) -> None:
        with self._lock:
            requests = list(self._requests.values())
        for request in requests:
            request.future.cancel()
        self._sock.close(linger=0)
        self._ctx.term()
        remove_core_address(self.address)
        with self._lock:
            self._closed = True
            os.close(self._wake_r)
            os.close(self._wake_w)


def _finished(request_id: int, result: Any) -> wire.Finished:
    return wire.Finished(request_id, [
        wire.CompletionMsg(c.index, c.token_ids, c.logprobs, [[(int(t), float(p)) for t, p in top] for top in c.top_logprobs],
                           c.text, c.finish_reason, c.forced_indices, c.adapters)
        for c in result.completions], result.prompt_tokens, result.adapter)


def _weights_from_wire(data: bytes, config: dict | None) -> tuple[dict[str, Any], Any]:
    from peft import LoraConfig
    from safetensors.torch import load

    weights = load(data)
    fields = {k: v for k, v in (config or {}).items() if k in LoraConfig.__dataclass_fields__ and k != "peft_type"}
    return weights, LoraConfig(**fields)


def _load_function(spec: str) -> Any:
    module, _, name = spec.partition(":")
    if not module or not name:
        raise ConfigError(f"load_model={spec!r} must be 'module:function'", what="engine core")
    return getattr(importlib.import_module(module), name)


def run_core(spec: CoreSpec) -> None:
    """Load the model, build the engine and serve it until shut down (the process's main thread)."""
    from groupwise.inference.engine import Engine
    from groupwise.runtime.compute import compute_thread
    from groupwise.runtime.loading import load_base_model
    from groupwise.runtime.memory import free_memory_bytes

    load = _load_function(spec.load_model) if spec.load_model else load_base_model
    # loaded on the thread that will step the engine (compute.py: one OpenMP team)
    weights, tokenizer = compute_thread().call(load, spec.model, device=spec.device, dtype=spec.dtype)
    kwargs = dict(spec.engine_kwargs)
    if "max_kv_bytes" not in kwargs:
        kwargs["max_kv_bytes"] = (int(spec.max_kv_gb * 2**30) if spec.max_kv_gb else
                                  free_memory_bytes(next(weights.parameters()).device) // 3)
    engine = Engine(weights, tokenizer, **kwargs)
    print(f"engine core (pid {os.getpid()}): KV cache at most {kwargs['max_kv_bytes'] / 2**30:.1f} GiB, "
          f"{engine.context_length} tokens per sequence x {engine.max_batch_size} sequences", flush=True)
    server = EngineCoreServer(engine, spec.address, owner_pid=spec.owner_pid)
    try:
        server.run()
    finally:
        engine.close()


def main() -> None:
    spec = msgspec.msgpack.decode(sys.stdin.buffer.read(), type=CoreSpec)
    run_core(spec)


if __name__ == "__main__":
    main()
