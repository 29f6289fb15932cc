# Restated from deathbyknowledge/shellm, rl/run_agent.py (corpus/README.md): a shell agent whose turns
# are commands run in a sandbox, served by a remote vLLM (BASE_URL) unless LOCAL; a Trajectory
# subclass with required fields of its own; a reward from exit codes, the task's success check and
# the format. Every use of ART is kept call for call.
from typing import List

import art
from openai import AsyncOpenAI
from tenacity import retry, stop_after_attempt

from project_types import Message, Scenario
from sandbox import SoSClient

LOCAL = False
MAX_TURNS = 30
BASE_URL = "http://rearden:8000/v1"
API_KEY = "MEOW"
oai = AsyncOpenAI(base_url=BASE_URL, api_key=API_KEY)
sos = SoSClient(server_url="http://localhost:3000")


class ProjectTrajectory(art.Trajectory):
    task_id: str
    sandbox_id: str
    exit_codes: List[int]
    success_condition_passed: bool
    corrupted: bool


async def run_agent(model: art.Model, scenario: Scenario) -> ProjectTrajectory:
    client = model.openai_client() if LOCAL else oai
    sandbox_id = await sos.create_sandbox(setup_commands=scenario.setup_commands)
    traj = ProjectTrajectory(reward=0.0, messages_and_choices=[], task_id=scenario.id, sandbox_id=sandbox_id,
                             exit_codes=[], success_condition_passed=False, corrupted=False)
    traj.messages_and_choices = [{"role": "system", "content": scenario.task}]
    await sos.start_sandbox(sandbox_id)

    async def finish_traj(success_command: str) -> bool:
        _, _, code = await sos.exec_command(sandbox_id, success_command, standalone=True)
        await sos.stop_sandbox(sandbox_id)
        return code == 0

    for _ in range(MAX_TURNS):
        @retry(stop=stop_after_attempt(3))
        async def get_response():
            response = await client.chat.completions.create(messages=traj.messages(), model=model.name, max_tokens=16)
            return response.choices[0]

        response_message = await get_response()
        traj.messages_and_choices.append(response_message)
        if not response_message.message.content:
            traj.success_condition_passed = await finish_traj(scenario.success_condition)
            traj.corrupted = True
            return traj
        cmd = response_message.message.content
        if "exit 0" in cmd:
            traj.success_condition_passed = await finish_traj(scenario.success_condition)
            return traj
        stdout, stderr, exit_code = await sos.exec_command(sandbox_id, cmd)
        traj.messages_and_choices.append({"role": "user", "content": (stdout or "") + (stderr or "")})
        if exit_code != -1:
            traj.exit_codes.append(exit_code)
    traj.success_condition_passed = await finish_traj(scenario.success_condition)
    return traj


async def run_agent_and_score(model: art.Model, scenario: Scenario) -> ProjectTrajectory:
    traj = await run_agent(model, scenario)

    def check_format(messages: List[Message]) -> float:
        r = sum(-0.1 for msg in messages if "<think>" in (msg.get("content") or ""))
        return max(r, -0.2)

    reward = 0.0
    if not traj.corrupted:
        reward += max(sum(-0.1 for x in traj.exit_codes if x != 0), -0.3)
        reward += 1.0 if traj.success_condition_passed else 0.0
        reward += check_format(traj.messages())
    traj.reward = reward
    return traj
