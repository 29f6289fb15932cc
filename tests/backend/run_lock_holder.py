"""A real process that trains a run: registers a model on a LocalBackend (which takes the run folder's
writer lock), says so on stdout, then waits until it is killed. Used by test_run_lock.py.

    python run_lock_holder.py BASE_PATH MODEL_DIR
"""

from __future__ import annotations

import asyncio
import json
import os
import sys

import groupwise as gw


async def main(base_path: str, model_dir: str) -> None:
    model = gw.TrainableModel(name="agent", project="p", base_model=model_dir)
    await model.register(gw.LocalBackend(path=base_path, best_checkpoint_metric=None))
    print(json.dumps({"registered": True, "pid": os.getpid()}), flush=True)
    sys.stdin.readline()  # blocks the process (and its lock) until the test kills it


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2]))
