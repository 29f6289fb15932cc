# Stand-in for deathbyknowledge/shellm's rl/sandbox.py client (corpus/README.md): the original talks
# to a sandbox server over HTTP (create, start, exec, stop); this one gives each sandbox a temporary
# folder and runs the commands there with bash, with the same methods and results.
import asyncio
import itertools
import shutil
import tempfile


class SoSClient:
    _ids = itertools.count()

    def __init__(self, server_url: str) -> None:
        self.server_url = server_url
        self.boxes: dict[str, tuple[str, list[str]]] = {}

    async def create_sandbox(self, setup_commands: list[str]) -> str:
        sandbox_id = f"box{next(self._ids)}"
        self.boxes[sandbox_id] = (tempfile.mkdtemp(prefix="sos-"), setup_commands)
        return sandbox_id

    async def start_sandbox(self, sandbox_id: str) -> None:
        for command in self.boxes[sandbox_id][1]:
            await self.exec_command(sandbox_id, command, standalone=True)

    async def exec_command(self, sandbox_id: str, command: str, standalone: bool = False):
        proc = await asyncio.create_subprocess_exec("bash", "-c", command, cwd=self.boxes[sandbox_id][0],
                                                    stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        try:
            out, err = await asyncio.wait_for(proc.communicate(), timeout=10)
        except asyncio.TimeoutError:
            proc.kill()
            return "", "timed out", -1
        return out.decode(errors="replace"), err.decode(errors="replace"), proc.returncode

    async def stop_sandbox(self, sandbox_id: str) -> None:
        shutil.rmtree(self.boxes[sandbox_id][0], ignore_errors=True)
