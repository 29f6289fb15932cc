"""ART's benchmarking helpers at ART's paths (`art.utils.benchmarking`), over groupwise's run store.

ART 0.3+: `load_trajectories` (a polars DataFrame of every stored trajectory of a project), the charts
(`charts.training_progress_chart`, `charts.percentage_comparison_bar_chart`; matplotlib),
`BenchmarkModelKey`, `filter_rename_model_split` and `pull_model_trajectories`. ART 0.1-0.2 kept its
first helpers at this path (`load_benchmarked_models`, `generate_comparison_table`, ...); they are here
too, from `groupwise.utils.old_benchmarking`. polars and pandas come with the ``benchmarking`` extra.
Nothing is imported until used, so importing this package needs neither.
"""
