"""`zenml.logger.get_logger`: the standard library's logger."""
import logging


def get_logger(name: str) -> logging.Logger:
    return logging.getLogger(name)
