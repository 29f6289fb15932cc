"""dashboard: `groupwise dashboard [PATH]`, a local web page that watches runs while they train.

- runs.py      which runs a folder holds, each run's state and summary, its curves (from history.jsonl)
- rollouts.py  steps, groups, trajectories with their tokens, two steps side by side (trajectory files)
- app.py       the FastAPI app: the JSON API over those readers, the static page, the command
- static/      the page (index.html, app.js, style.css) and uPlot, the chart library, shipped here

A reader of the run store at the top of the layers, through the run-reading view every reader uses
(`groupwise.runs.view`): it opens none of the store's files itself, imports no model code (no torch),
takes no lock, writes nothing. The page polls the API every 2 s.
"""
