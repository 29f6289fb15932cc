"""`SkyPilotBackend`: ART's backend on a SkyPilot cluster, here a `LocalBackend`.

ART's `SkyPilotBackend.initialize_cluster(...)` launches a GPU machine with SkyPilot and trains there;
groupwise launches nothing. ART's examples and notebooks that start with it (2048, tic-tac-toe, wiki
game, ...) run here with only the import changed: `initialize_cluster` warns (`ArtCompatWarning`) that
the model is served and trained on this machine, naming the cluster arguments it ignores, and returns
a `LocalBackend`; `down()` closes it. Variables of `env_path`, which ART sends to the cluster's server,
are set in this process where they are not set already (the server is this process here). To train
on several machines, use `gw.RayBackend` on a Ray cluster.
"""

from __future__ import annotations

import os
import warnings
from typing import Any

from groupwise.backend.local import LocalBackend
from groupwise.errors import ArtCompatWarning

__all__ = ["SkyPilotAPI", "SkyPilotBackend"]


class SkyPilotBackend(LocalBackend):
    """ART's SkyPilot backend: a `LocalBackend` (module doc). `initialize_cluster` is how ART builds it;
    the constructor takes LocalBackend's arguments."""

    @classmethod
    async def initialize_cluster(cls, *, cluster_name: str = "art", gpu: str | None = None, resources: Any = None,
                                 art_version: str | None = None, env_path: str | None = None,
                                 force_restart: bool = False, tail_logs: bool = True,
                                 **local: Any) -> "SkyPilotBackend":
        """A backend on this machine (module doc). `local` takes LocalBackend's arguments (``path=``,
        ``devices=``, ...)."""
        given = {"gpu": gpu, "resources": resources, "art_version": art_version,
                 "force_restart": force_restart or None, "tail_logs": None if tail_logs else False}
        ignored = [name for name, value in given.items() if value is not None]
        warnings.warn(
            f"SkyPilotBackend.initialize_cluster(cluster_name={cluster_name!r}): groupwise launches no cluster, so "
            "this backend is a LocalBackend: the model is served and trained on this machine"
            + (f" ({', '.join(ignored)} ignored)" if ignored else "")
            + "; use gw.LocalBackend() here, or gw.RayBackend() for several machines (docs/porting-from-art.md).",
            ArtCompatWarning, stacklevel=2)
        if env_path is not None:
            from dotenv import dotenv_values

            for name, value in dotenv_values(env_path).items():
                if value is not None:
                    os.environ.setdefault(name, value)
        return cls(**local)

    async def down(self) -> None:
        """ART stops the cluster; here the backend is closed (its engines and workers stop)."""
        await self.close()


SkyPilotAPI = SkyPilotBackend  # ART 0.2's name (``art.skypilot.SkyPilotAPI``)

