"""Show image files side by side in a notebook (the line graphs `generate_line_graphs` saved)."""

from __future__ import annotations

import html

from groupwise.errors import GroupwiseError

__all__ = ["display_image_grid"]


def display_image_grid(image_paths: list[str], images_per_row: int = 2) -> None:
    """Display `image_paths` in a grid of `images_per_row` columns (IPython, as in a notebook)."""
    try:
        from IPython.display import HTML, display
    except ImportError as exc:
        raise GroupwiseError("display_image_grid shows images in a notebook (IPython), which is not installed "
                             f"here; open the files instead: {', '.join(map(str, image_paths))}") from exc
    cells = "".join(f"<img src='{html.escape(str(p), quote=True)}' style='max-width: 100%; height: auto;'>"
                    for p in image_paths)
    display(HTML(f"<div style='display: grid; grid-template-columns: repeat({int(images_per_row)}, 1fr); "
                 f"gap: 10px;'>{cells}</div>"))
