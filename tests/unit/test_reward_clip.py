"""Reward clipping (``env.reward_clip``): the spec's default, and where each engine clips while the raw score is
kept for the reports (the engines end to end: tests/integration/test_time_budget.py)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from tensordict import TensorDict

from crossrl.adapters.rllib.adapter import chunk_score
from crossrl.adapters.torchrl.adapter import clip_rewards_
from crossrl.core import sample_batch as sb
from crossrl.core.algorithms import load
from crossrl.core.envs import SCORE_KEY, SignRewardKeepScore, make_env
from crossrl.core.evaluator import PolicyEvaluator
from crossrl.core.policy import PolicySpec
from crossrl.scenarios.catalog import HYPERPARAM_DEFAULTS
from crossrl.scenarios.loader import SpecError, validate
from crossrl.scenarios.spec import EnvSpec, ModelSpec

SCORED = "score_env:ScoredCartPole-v0"  # tests/support/score_env.py: 3 points per step


def test_clipping_is_on_for_atari_and_off_elsewhere_unless_stated() -> None:
    assert EnvSpec(id="ALE/Breakout-v5").resolved_reward_clip
    assert not EnvSpec(id="ALE/Breakout-v5", reward_clip=False).resolved_reward_clip
    assert not EnvSpec(id="ALE/Breakout-v5", preprocessing="none").resolved_reward_clip
    assert not EnvSpec(id="MinAtar/Breakout-v1").resolved_reward_clip
    assert EnvSpec(id="CartPole-v1", reward_clip=True).resolved_reward_clip


def test_fingerprint_counts_clipping_as_resolved() -> None:
    base = {"name": "x", "env": {"id": "CartPole-v1"}, "algorithm": {"name": "ppo"}, "budget": {"env_steps": 100}}
    plain = validate(base, label="x.yaml")
    assert "reward_clip" not in plain.canonical()["env"]  # fingerprints from before the field still match
    off = validate({**base, "env": {"id": "CartPole-v1", "reward_clip": False}}, label="x.yaml")
    on = validate({**base, "env": {"id": "CartPole-v1", "reward_clip": True}}, label="x.yaml")
    assert off.fingerprint() == plain.fingerprint() != on.fingerprint()
    atari = {**base, "env": {"id": "ALE/Breakout-v5"}}
    stated = {**base, "env": {"id": "ALE/Breakout-v5", "reward_clip": True}}
    assert validate(atari, label="x.yaml").fingerprint() == validate(stated, label="x.yaml").fingerprint()


def test_clipping_a_multi_agent_env_is_refused_with_the_fix() -> None:
    raw = {
        "name": "x",
        "env": {"id": "mpe2:simple_spread_v3", "agents": "shared", "reward_clip": True},
        "algorithm": {"name": "ppo"},
        "budget": {"env_steps": 100},
    }
    with pytest.raises(SpecError) as e:
        validate(raw, label="x.yaml")
    [line] = e.value.problems
    assert "reward_clip: true is for single-agent envs" in line and "set it to false" in line


def _evaluator(reward_clip: bool) -> PolicyEvaluator:
    alg = load("ppo")
    return PolicyEvaluator(
        env_spec=EnvSpec(id=SCORED, reward_clip=reward_clip),
        num_envs=2,
        policy_factory=PolicySpec(
            policy_cls=alg.policy_cls,
            hyperparams=alg.hyperparams(HYPERPARAM_DEFAULTS["ppo"]),
            model=ModelSpec(hidden=(16,)),
        ),
        seed=0,
        worker_index=0,
    )


@pytest.mark.parametrize("reward_clip", [True, False])
def test_crossrl_learns_on_clipped_rewards_and_counts_raw_returns(reward_clip: bool) -> None:
    batch = _evaluator(reward_clip).sample(num_steps=120)  # random CartPole: episodes of ~20 steps end
    rewards = batch[sb.REWARDS][batch[sb.VALID]]
    assert set(np.unique(rewards)) == ({1.0} if reward_clip else {3.0})
    assert batch.episode_returns, "no episode ended"
    assert batch.episode_returns == pytest.approx([3.0 * n for n in batch.episode_lengths])


def test_rllib_env_steps_clipped_and_the_returns_it_reports_are_raw() -> None:
    from ray.rllib.env.single_agent_episode import SingleAgentEpisode

    env = SignRewardKeepScore(make_env(EnvSpec(id=SCORED)))
    obs, info = env.reset(seed=0)
    episode = SingleAgentEpisode()
    episode.add_env_reset(observation=obs, infos=info)
    for t in range(6):
        obs, reward, term, trunc, info = env.step(t % 2)
        assert reward == 1.0 and info[SCORE_KEY] == 3.0
        episode.add_env_step(observation=obs, action=t % 2, reward=reward, infos=info, terminated=term)
        if t == 3:  # the env runner cuts an ongoing episode at the end of a fragment
            first, episode = episode, episode.cut()
    assert first.get_return() == 4.0 and episode.get_return() == 2.0  # what RLlib's learners see
    assert chunk_score(first) + chunk_score(episode) == 18.0  # what crossrl reports: 6 steps x 3 points
    plain = SingleAgentEpisode()
    plain.add_env_reset(observation=obs, infos={})
    plain.add_env_step(observation=obs, action=0, reward=2.5, infos={})
    assert chunk_score(plain) == 2.5  # no clipping: the rewards themselves


def test_torchrl_batch_clipped_after_the_episode_returns_are_read() -> None:
    data = TensorDict(
        {
            "next": {
                "reward": torch.tensor([[3.0], [0.0], [-0.5]]),
                "episode_reward": torch.tensor([[3.0], [3.0], [2.5]]),
            }
        },
        batch_size=[3],
    )
    clip_rewards_(data)
    assert data["next", "reward"].flatten().tolist() == [1.0, 0.0, -1.0]
    assert data["next", "episode_reward"].flatten().tolist() == [3.0, 3.0, 2.5]


def test_rllib_env_creator_wraps_the_env_only_when_clipping() -> None:
    from crossrl.adapters.rllib.adapter import env_creator

    clipped = env_creator({"env_spec": EnvSpec(id="ALE/Breakout-v5").model_dump(mode="json")})
    plain = env_creator({"env_spec": EnvSpec(id="MinAtar/Breakout-v1").model_dump(mode="json")})
    assert isinstance(clipped, SignRewardKeepScore) and not isinstance(plain, SignRewardKeepScore)
    clipped.close()
    plain.close()


class _Collector:
    """One batch, then the sink is spent: what :func:`train_loop` iterates and syncs."""

    def __init__(self, data: TensorDict) -> None:
        self.data = data

    def __iter__(self):  # type: ignore[no-untyped-def]
        yield self.data

    def update_policy_weights_(self) -> None:
        pass


class _Learner:
    always_sync = False

    def __init__(self) -> None:
        self.rewards: list[float] = []

    def learn(self, data: TensorDict) -> tuple[int, dict[str, float]]:
        self.rewards = data["next", "reward"].flatten().tolist()
        return 0, {}

    def save(self, folder: object) -> None:
        return None


class _Sink:
    def __init__(self) -> None:
        self.exhausted = False
        self.returns: list[float] = []

    def point(self, *, episode_returns: list[float], **_: object) -> None:
        self.returns, self.exhausted = list(episode_returns), True

    def resumed(self) -> None:  # a trial from scratch, without checkpoints
        return None

    def start_clock(self) -> None: ...

    def checkpoint_if_due(self, save: object) -> None: ...

    def final_checkpoint(self, save: object) -> None: ...


@pytest.mark.parametrize("reward_clip", [True, False])
def test_torchrl_train_loop_hands_the_learner_clipped_rewards_and_reports_raw_returns(reward_clip: bool) -> None:
    from crossrl.adapters.torchrl.adapter import train_loop

    data = TensorDict(
        {
            "next": {
                "reward": torch.tensor([[3.0], [3.0]]),
                "episode_reward": torch.tensor([[3.0], [6.0]]),
                "done": torch.tensor([[False], [True]]),
                "step_count": torch.tensor([[1], [2]]),
            }
        },
        batch_size=[2],
    )
    learner, sink = _Learner(), _Sink()
    train_loop(collector=_Collector(data), learner=learner, sink=sink, reward_clip=reward_clip)  # type: ignore[arg-type]
    assert learner.rewards == ([1.0, 1.0] if reward_clip else [3.0, 3.0])
    assert sink.returns == [6.0]
