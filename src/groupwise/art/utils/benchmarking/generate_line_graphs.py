"""ART 0.1-0.2's path of `generate_line_graphs` (`groupwise.utils.old_benchmarking.generate_line_graphs`, ART 0.3+'s path)."""

from groupwise.art.utils.old_benchmarking.generate_line_graphs import generate_line_graphs

__all__ = ["generate_line_graphs"]
