"""ART 0.1-0.2's path of `display_image_grid` (`groupwise.utils.old_benchmarking.display_image_grid`, ART 0.3+'s path)."""

from groupwise.art.utils.old_benchmarking.display_image_grid import display_image_grid

__all__ = ["display_image_grid"]
