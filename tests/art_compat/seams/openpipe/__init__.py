"""Stand-in for the OpenPipe SDK (request logging to a hosted service) in ART's programs: a client with
no API key, which ART's programs check (`if op_client.api_key:`) before reporting anything."""

from openpipe.client import AsyncOpenPipe, OpenPipe

__all__ = ["AsyncOpenPipe", "OpenPipe"]
