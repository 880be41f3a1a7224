"""The multi-agent point contract every engine's adapter test checks on the ma-smoke trial (MPE simple_spread,
3 agents, 400 env steps per iteration): team return = the sum of the agents' returns, per-policy losses whose
mean is the headline."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence

import pytest

from crossrl.scenarios import metrics as M

AGENTS = ("agent_0", "agent_1", "agent_2")
GROUPS = {"a": ["agent_0", "agent_1"], "b": ["agent_2"]}


def check_points(points: Sequence[Mapping[str, float]], *, budget: int, policies: Iterable[str]) -> None:
    policies = list(policies)
    assert points[-1][M.ENV_STEPS_SAMPLED] >= budget
    # train_batch 400 env steps (not agent steps) per iteration: 1200 agent steps with 3 agents
    assert [p[M.ENV_STEPS_SAMPLED] for p in points] == [400.0 * (i + 1) for i in range(len(points))]
    with_return = [p for p in points if M.EPISODE_RETURN_MEAN in p]
    assert with_return, "no episode completed"
    for p in with_return:
        per_agent = [p[M.agent_metric(a)] for a in AGENTS]
        assert p[M.EPISODE_RETURN_MEAN] == pytest.approx(sum(per_agent), rel=1e-5)
        assert p[M.EPISODE_RETURN_MEAN] < 0  # simple_spread pays negative distances
        assert p[M.EPISODE_LEN_MEAN] == 25  # max_cycles: every agent truncated at once
    for p in points:
        for name in (M.POLICY_LOSS, M.VALUE_LOSS, M.ENTROPY):
            own = [p[M.policy_metric(pid, name)] for pid in policies]
            assert all(math.isfinite(v) for v in own)
            assert p[name] == pytest.approx(sum(own) / len(own))  # the headline: the mean over policies
