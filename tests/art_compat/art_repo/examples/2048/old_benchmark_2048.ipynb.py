from art.utils.old_benchmarking.generate_comparison_table import generate_comparison_table
from art.utils.old_benchmarking.types import BenchmarkedModelKey

table = generate_comparison_table(
    project="2048-dev",
    benchmark_keys=[
        BenchmarkedModelKey("009", "train", [0, -2, -1]),
        BenchmarkedModelKey("011", "train"),
        BenchmarkedModelKey("gpt-4o-mini", "val")
    ],
    metrics=["reward", "max_value", "board_value"]
)

print(table.to_markdown())
# %% [code cell]
from art.utils.old_benchmarking.generate_line_graphs import generate_line_graphs
from art.utils.old_benchmarking.display_image_grid import display_image_grid
from art.utils.old_benchmarking.types import BenchmarkedModelKey

graph_image_paths = generate_line_graphs(
    project="2048-dev",
    line_graph_keys=[
        BenchmarkedModelKey("009", "train"),
        BenchmarkedModelKey("010", "train"),
        BenchmarkedModelKey("011", "train"),
        BenchmarkedModelKey("012", "train"),
    ],
    comparison_keys=[
        BenchmarkedModelKey("gpt-4o-mini", "val"),
        BenchmarkedModelKey("gpt-4o", "val")
    ],
    metrics=["reward", "reward_std_dev", "max_value", "board_value"],
    x_axis_metric="step"
)

display_image_grid(graph_image_paths)