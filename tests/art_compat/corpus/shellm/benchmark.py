# Restated from deathbyknowledge/shellm, rl/benchmark.py (corpus/README.md): validation rollouts of
# held-out tasks and their mean reward.
import art

from load_scenarios import load_scenarios
from run_agent import run_agent_and_score


async def benchmark(model: art.Model, num_scenarios: int):
    scenarios = load_scenarios(split="val", limit=num_scenarios)
    results = await art.gather_trajectories((run_agent_and_score(model, s) for s in scenarios), pbar_desc="val")
    score = sum(t.reward for t in results) / max(1, len(results))
    return results, score
