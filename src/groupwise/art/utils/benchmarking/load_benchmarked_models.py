"""ART 0.1-0.2's path of `load_benchmarked_models` (`groupwise.utils.old_benchmarking.load_benchmarked_models`, ART 0.3+'s path)."""

from groupwise.art.utils.old_benchmarking.load_benchmarked_models import load_benchmarked_models

__all__ = ["load_benchmarked_models"]
