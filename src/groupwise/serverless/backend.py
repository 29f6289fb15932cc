"""`ServerlessBackend`: ART's client of a hosted training service, here a `LocalBackend`.

ART's serverless backend sends each step to W&B's training service; groupwise has no hosted service
and trains on this machine. Half of ART's official notebooks start with ``ServerlessBackend()``, and
its API is LocalBackend's (`register`, `train` with ART 0.5's options, `model.log`,
`delete_checkpoints`), so such a program runs here with only the import changed: on this machine's
GPU (or CPU), its run under LocalBackend's ``<path>/<project>/<model>/``. Each construction warns
(`ArtCompatWarning`) that it trains here and names the service's own arguments it ignores (`api_key`,
`base_url`), so nobody believes their program trained remotely.
"""

from __future__ import annotations

import asyncio
import shutil
import warnings
from typing import Any

from groupwise.backend.base import ServerlessTrainResult
from groupwise.backend.local import LocalBackend
from groupwise.errors import ArtCompatWarning

__all__ = ["ServerlessBackend"]


class ServerlessBackend(LocalBackend):
    """ART's ``ServerlessBackend(api_key=, base_url=)``: a `LocalBackend` (module doc). Its other
    arguments are LocalBackend's (``devices=``, ``path=``, ...)."""

    def __init__(self, *, api_key: str | None = None, base_url: str | None = None, **local: Any) -> None:
        given = [name for name, value in (("api_key", api_key), ("base_url", base_url)) if value is not None]
        warnings.warn(
            "ServerlessBackend(): groupwise has no hosted training service, so this backend is a LocalBackend: "
            "the model is served and trained on this machine"
            + (f" ({' and '.join(given)} ignored)" if given else "")
            + "; use gw.LocalBackend() to say so (docs/porting-from-art.md).", ArtCompatWarning, stacklevel=2)
        super().__init__(**local)

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
