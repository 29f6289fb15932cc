"""The jobs behind the `groupwise` commands: the top floor, under `groupwise.cli` alone.

One module per command (`train`, `sft`, `audit`, `serve`, `report`, `inspect`, `compare`, `dashboard`, `judge eval`),
each with one dataclass that holds every setting of the job (help on each field, every value checked when
it is built: `fields.Job`) and a `run(job)` that does the work through the domain modules' typed
functions. The CLI is generated from these dataclasses (`groupwise.cli`); nothing else in groupwise
imports a job. An environment (`groupwise.envs`) is only its contract: its training defaults are a preset
of the train job (`train.PRESETS`).

This package imports nothing heavy when it loads: each `run` imports the domain it drives.
"""
