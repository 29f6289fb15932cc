"""Stand-in for ZenML (a pipeline orchestrator) in third-party ART programs: `@step` and `@pipeline`
run the function where it is called, as a local orchestrator does; `log_model_metadata` keeps what a
step logged (`LOGGED`) so a test can see it."""

LOGGED: list[dict] = []


def step(func=None, **kwargs):
    return func if func is not None else (lambda f: f)


def pipeline(func=None, **kwargs):
    return func if func is not None else (lambda f: f)


def log_model_metadata(metadata: dict, **kwargs) -> None:
    LOGGED.append(dict(metadata))
