"""Helpers users of ART expect, at ART's paths: `retry`, `iterate_dataset`, `limit_concurrency`,
`get_trajectory_messages`, `format_message`, `get_model_step`, `log_http_errors`, and `split_dataset`. `from groupwise.core.iterate_dataset import iterate_dataset` works as ART's does.
"""

from typing import Any

from groupwise.art.utils.format_message import format_message
from groupwise.art.utils.get_model_step import get_model_step
from groupwise.art.utils.get_trajectory_messages import get_trajectory_messages
from groupwise.core.iterate_dataset import DatasetBatch, epoch_order, iterate_dataset
from groupwise.art.utils.limit_concurrency import limit_concurrency
from groupwise.art.utils.log_http_errors import log_http_errors
from groupwise.core.retry import retry
from groupwise.core.split_dataset import split_dataset

__all__ = ["DatasetBatch", "epoch_order", "format_message", "get_model_step", "get_trajectory_messages",
           "iterate_dataset", "limit_concurrency", "log_http_errors", "retry", "split_dataset"]


def __getattr__(name: str) -> Any:
    # ART's names that are not provided say why and what to use instead (groupwise.core.compat.NOT_PROVIDED)
    from groupwise.core.compat import not_provided

    raise not_provided("groupwise.art.utils", name)
