"""`ServerlessBackend`: ART's client of a hosted training service, here a `LocalBackend`.

ART's serverless backend sends each step to W&B's training service; groupwise has no hosted service
and trains on this machine. Half of ART's official notebooks start with ``ServerlessBackend()``, and
its API is LocalBackend's (`register`, `train` with ART 0.5's options, `model.log`,
`delete_checkpoints`), so such a program runs here with only the import changed: on this machine's
GPU (or CPU), its run under LocalBackend's ``<path>/<project>/models/<model>/``. Each construction warns
(`ArtCompatWarning`) that it trains here and names the service's own arguments it ignores (`api_key`,
`base_url`), so nobody believes their program trained remotely.

Every ``ServerlessBackend()`` of an ART program is a client of the one hosted service, so programs
build a second one to evaluate or resume a model that the first is training (``eval_backend =
ServerlessBackend(); await TrainableModel(name=<the same>).register(eval_backend)``). A run has one
writer here (`groupwise.runs.lock`), so the clients of a process built with the same LocalBackend
arguments are one backend: the second construction returns the first while it is open, and the
service closes when its last client does.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import warnings
import weakref
from typing import Any

from groupwise.backend.base import ServerlessTrainResult
from groupwise.backend.local import DEFAULT_PATH, LocalBackend
from groupwise.core.compat import ART_SERVERLESS_TRAIN_KEYWORDS, with_art_keywords
from groupwise.errors import ArtCompatWarning

__all__ = ["ServerlessBackend"]

# The open backend ("the service") of each set of LocalBackend arguments; a backend nobody holds goes.
_SERVICES: "weakref.WeakValueDictionary[tuple[Any, ...], ServerlessBackend]" = weakref.WeakValueDictionary()


def _service_key(cls: type, local: dict[str, Any]) -> tuple[Any, ...]:
    """The arguments that make two constructions the same service: the class and LocalBackend's
    arguments, the store folder as an absolute path (a relative one names another folder after a chdir)."""
    path = os.path.abspath(local.get("path") or DEFAULT_PATH)
    return (cls, path, repr(sorted((k, v) for k, v in local.items() if k != "path")))


class ServerlessBackend(LocalBackend):
    """ART's ``ServerlessBackend(api_key=, base_url=)``: a `LocalBackend` (module doc). Its other
    arguments are LocalBackend's (``devices=``, ``path=``, ...). Constructed again with the same
    LocalBackend arguments while open, it is the same backend (module doc)."""

    _service_clients = 0  # constructions not yet closed; 0: not (or no longer) a service

    def __new__(cls, *, api_key: str | None = None, base_url: str | None = None, **local: Any) -> "ServerlessBackend":
        shared = _SERVICES.get(_service_key(cls, local))
        if shared is not None and shared._service_clients > 0:
            return shared
        return super().__new__(cls)

    def __init__(self, *, api_key: str | None = None, base_url: str | None = None, **local: Any) -> None:
        given = [name for name, value in (("api_key", api_key), ("base_url", base_url)) if value is not None]
        warnings.warn(
            "ServerlessBackend(): groupwise has no hosted training service, so this backend is a LocalBackend: "
            "the model is served and trained on this machine"
            + (f" ({' and '.join(given)} ignored)" if given else "")
            + "; use gw.LocalBackend() to say so (docs/porting-from-art.md).", ArtCompatWarning, stacklevel=2)
        if self._service_clients > 0:  # another client of the open service (__new__): nothing to build
            self._service_clients += 1
            return
        super().__init__(**local)
        self._service_clients = 1
        _SERVICES[_service_key(type(self), local)] = self

    def _last_client_leaves(self) -> bool:
        """Count one client out; True when it was the last, and the service closes."""
        self._service_clients = max(0, self._service_clients - 1)
        return self._service_clients == 0

    async def close(self) -> None:
        """Close this client; the backend closes with the last client of the service (module doc)."""
        if self._last_client_leaves():
            await super().close()

    def __exit__(self, *exc: Any) -> None:
        if self._last_client_leaves():
            super().__exit__(*exc)

    @with_art_keywords(**ART_SERVERLESS_TRAIN_KEYWORDS)
    async def train(self, model: Any, trajectory_groups: Any, config: Any = None, **options: Any) -> ServerlessTrainResult:
        """LocalBackend's step, returned as ART's `ServerlessTrainResult`."""
        result = await super().train(model, trajectory_groups, config, **options)
        return ServerlessTrainResult(step=result.step, metrics=result.metrics, checkpoint_path=result.checkpoint_path)

    async def delete(self, model: Any) -> None:
        """ART's ``backend.delete(model)``: the model is gone from the backend. Here that is its run: it is
        unregistered and its run folder (checkpoints, history, trajectories) deleted. A model that
        does not train has nothing here, as in ART."""
        from groupwise.model import TrainableModel

        if not isinstance(model, TrainableModel):
            return
        await self.unregister(model)
        await asyncio.to_thread(shutil.rmtree, model.store.run_dir, True)
