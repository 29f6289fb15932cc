"""See openpipe/__init__.py: clients without a key, whose reporting calls do nothing."""

import os


class OpenPipe:
    def __init__(self, api_key=None, **kwargs):
        self.api_key = api_key if api_key is not None else os.environ.get("OPENPIPE_API_KEY")

    def report(self, **kwargs):
        return None

    def update_log_metadata(self, **kwargs):
        return None


class AsyncOpenPipe(OpenPipe):
    async def report(self, **kwargs):
        return None

    async def update_log_metadata(self, **kwargs):
        return None
