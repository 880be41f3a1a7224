"""crossrl's engine on a multi-agent env with IMPALA: ``async_samples`` and V-trace over the policy map, with no
special case in the optimizer (each policy's V-trace runs on its own time-major sub-batch)."""

from __future__ import annotations

import pytest

from crossrl.adapters.base import ListSink
from crossrl.adapters.crossrl import CrossrlAdapter
from crossrl.adapters.registry import unsupported
from crossrl.scenarios import metrics as M
from crossrl.scenarios.loader import load

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("ray_cluster")]


@pytest.mark.parametrize("agents", ["shared", "independent"])
def test_impala_on_async_samples_over_a_policy_map(agents: str) -> None:
    spec, _ = load(
        "ma-smoke",
        overrides={
            "engines": ["crossrl"],
            "env.agents": agents,
            "algorithm.name": "impala",
            "algorithm.hyperparams": {"train_batch": 200, "rollout_fragment": 25},
            "execution.workers": [2],
            "budget.env_steps": 1600,
        },
    )
    [trial] = spec.trials()
    assert trial.optimizer == "async_samples" and unsupported([trial]) == []
    sink = ListSink(trial)
    CrossrlAdapter().run(trial, sink)
    points = sink.points
    assert points[-1][M.ENV_STEPS_SAMPLED] >= 1600
    learned = [p for p in points if M.POLICY_LOSS in p]
    assert learned and all(M.DIAG_POLICY_LAG in p for p in learned)
    with_return = [p for p in points if M.EPISODE_RETURN_MEAN in p]
    assert with_return
    names = [M.agent_metric(f"agent_{i}") for i in range(3)]
    for p in with_return:
        assert p[M.EPISODE_RETURN_MEAN] == pytest.approx(sum(p[n] for n in names))
    if agents == "independent":  # one V-trace loss per policy
        assert all(M.policy_metric(f"agent_{i}", M.POLICY_LOSS) in learned[-1] for i in range(3))
