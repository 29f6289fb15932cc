import importlib
import os
import polars as pl

from art.utils.benchmarking.load_trajectories import load_trajectories
from art.utils.benchmarking.charts import percentage_comparison_bar_chart, training_progress_chart
import art.utils.benchmarking.charts
from art.utils.benchmarking.types import BenchmarkModelKey
from art.utils.get_repo_root_path import get_repo_root_path

importlib.reload(art.utils.benchmarking.charts)

project_name = "tic-tac-toe-local"

# await load_trajectories.bust_cache()
df = await load_trajectories(
    project_name=project_name,
    models=["009", "001-script", "gpt-4o", "gpt-4.1"],
    debug=True,
)  # type: ignore


# Create the first chart (bar chart)
fig1 = percentage_comparison_bar_chart(
    df,
    metric_name="win",
    models=[
        BenchmarkModelKey("001-script", "agent-001", "train"),
        BenchmarkModelKey("gpt-4o", "GPT-4o"),
        BenchmarkModelKey("gpt-4.1", "GPT-4.1"),
    ],
    title="Percentage of Games Won",
)

benchmarks_dir = f"{get_repo_root_path()}/assets/benchmarks/{project_name}"

os.makedirs(benchmarks_dir, exist_ok=True)

fig1.savefig(f"{benchmarks_dir}/accuracy-comparison.svg")

# %% [code cell]
# Create the second chart (line chart)
fig2 = training_progress_chart(
    df.filter(pl.col("step").ne(592)),
    "win",
    models=[
        BenchmarkModelKey("001-script", "agent-001", "train"),
        BenchmarkModelKey("gpt-4o", "GPT-4o"),
        BenchmarkModelKey("gpt-4.1", "GPT-4.1"),
    ],
    title="Fraction of Games Won",
    y_label="Win rate",
)
# Save the second chart using the helper
fig2.savefig(f"{benchmarks_dir}/accuracy-training-progress.svg")
