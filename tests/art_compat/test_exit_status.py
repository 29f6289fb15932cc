"""A ported program that fails exits as a Python program does: its traceback and exit status 1.

The rollout raises while the engine is still decoding another rollout's long request, so the
process's compute thread is inside a torch kernel when the interpreter exits (compute.py says why
that aborted the process with SIGABRT before it was stopped at exit)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

PROGRAM = textwrap.dedent('''
    import asyncio, sys
    import groupwise as art
    from groupwise.local import LocalBackend

    async def rollout(model: art.TrainableModel, i: int) -> art.Trajectory:
        client = model.openai_client()
        await client.chat.completions.create(model=model.get_inference_name(), max_tokens=2 if i == 0 else 4000,
                                             messages=[{"role": "user", "content": "hi"}])
        raise ValueError("rollout exploded")

    async def main():
        model = art.TrainableModel(name="m", project="p", base_model=sys.argv[1])
        await model.register(LocalBackend(path=sys.argv[2]))
        await art.gather_trajectory_groups([art.TrajectoryGroup(rollout(model, i) for i in range(2))])

    asyncio.run(main())
''')


def test_a_failing_program_exits_with_its_exception_and_status_1(tiny_model_dir, tmp_path):
    script = tmp_path / "program.py"
    script.write_text(PROGRAM)
    proc = subprocess.run([sys.executable, str(script), tiny_model_dir, str(tmp_path / "runs")],
                          capture_output=True, text=True, timeout=300)
    assert "terminate called" not in proc.stderr
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert proc.stderr.rstrip().endswith("ValueError: rollout exploded")
    assert "groupwise.errors.GatherError" in proc.stderr
