"""Stand-in for ART's `art.tinker_native` (Thinking Machines' hosted Tinker trainer, an external service):
`TinkerNativeBackend` is groupwise's LocalBackend on this machine; its `path` is LocalBackend's."""

from groupwise.backend.local import LocalBackend


class TinkerNativeBackend(LocalBackend):
    def __init__(self, path: str | None = None, **kwargs):
        super().__init__(path=path)
