# Restated from johnson7788/RLDecisionAgent, backend/ART_mcp-rl/mcp_rl/benchmarks/generate_benchmarks.py
# (corpus/README.md): validation groups of a model, and a per-trajectory metric of whether the trained
# model beat a control model (a prompted art.Model) on the same scenario.
import art

from ..rollout import rollout


async def generate_val_groups(model: art.Model, val_scenarios) -> list[art.TrajectoryGroup]:
    return await art.gather_trajectory_groups(
        (art.TrajectoryGroup(rollout(model, scenario, False) for _ in range(1)) for scenario in val_scenarios),
        pbar_desc=f"val {model.name}", max_exceptions=len(val_scenarios))


async def calculate_beat_comp(groups, control_groups, control_first: bool = True) -> None:
    for group, control in zip(groups, control_groups):
        for trajectory, other in zip(group.trajectories, control.trajectories):
            key = "beat_comp" if control_first else "beat_comp_second"
            trajectory.metrics[key] = float(trajectory.reward > other.reward)
