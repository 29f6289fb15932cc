"""ART 0.1-0.2's path of `generate_comparison_table` (`groupwise.utils.old_benchmarking.generate_comparison_table`, ART 0.3+'s path)."""

from groupwise.art.utils.old_benchmarking.generate_comparison_table import generate_comparison_table

__all__ = ["generate_comparison_table"]
