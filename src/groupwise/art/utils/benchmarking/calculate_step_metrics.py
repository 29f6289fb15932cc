"""ART 0.1-0.2's path of `calculate_step_std_dev` (`groupwise.utils.old_benchmarking.calculate_step_metrics`, ART 0.3+'s path)."""

from groupwise.art.utils.old_benchmarking.calculate_step_metrics import calculate_step_std_dev

__all__ = ["calculate_step_std_dev"]
