"""crossrl's lean vector env against gymnasium's SyncVectorEnv: the same transitions, step for step."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

from crossrl.core.envs import SerialVectorEnv, check_env, make_env, make_vector_env
from crossrl.scenarios.spec import EnvSpec


def _pair(spec: EnvSpec, n: int) -> tuple[gym.vector.VectorEnv, gym.vector.VectorEnv]:
    fns = [lambda: make_env(spec) for _ in range(n)]
    return SerialVectorEnv(fns), gym.vector.SyncVectorEnv(fns, copy=False)


@pytest.mark.parametrize(
    ("spec", "steps"),
    [(EnvSpec(id="CartPole-v1", step_latency_ms=0.001), 400), (EnvSpec(id="Pendulum-v1"), 450)],
    ids=["cartpole-latency", "pendulum"],
)
def test_serial_vector_env_steps_exactly_like_sync_vector_env(spec: EnvSpec, steps: int) -> None:
    lean, ref = _pair(spec, 3)
    o1, _ = lean.reset(seed=7)
    o2, _ = ref.reset(seed=7)
    np.testing.assert_array_equal(o1, o2)
    lean.action_space.seed(1)
    ends = 0
    for t in range(steps):
        a = lean.action_space.sample()
        got, want = lean.step(a), ref.step(a)
        for g, w, name in zip(got[:4], want[:4], ("obs", "rewards", "terminated", "truncated"), strict=True):
            np.testing.assert_array_equal(g, w, err_msg=f"{name} differ at step {t}")
            assert g.dtype == w.dtype and g.shape == w.shape
        ends += int(np.count_nonzero(got[2] | got[3]))
    assert ends >= 3  # episodes ended and the autoreset steps (reward 0, a fresh obs) matched too


def test_reset_mid_episode_and_with_a_mask_matches_too() -> None:
    lean, ref = _pair(EnvSpec(id="CartPole-v1", step_latency_ms=0.001), 2)
    for env in (lean, ref):
        env.reset(seed=3)
    actions = np.ones(2, np.int64)
    for _ in range(12):  # always pushing right: both episodes end within a dozen steps
        lean.step(actions)
        ref.step(actions)
    mask = np.array([True, False])
    np.testing.assert_array_equal(
        lean.reset(options={"reset_mask": mask})[0], ref.reset(options={"reset_mask": mask})[0]
    )
    for t in range(30):
        got, want = lean.step(actions), ref.step(actions)
        for g, w in zip(got[:4], want[:4], strict=True):
            np.testing.assert_array_equal(g, w, err_msg=f"step {t} after the masked reset")


def test_make_vector_env_picks_the_native_vector_env_without_latency_and_the_lean_one_with() -> None:
    assert not isinstance(make_vector_env(EnvSpec(id="CartPole-v1"), 2), gym.vector.SyncVectorEnv)
    assert isinstance(make_vector_env(EnvSpec(id="CartPole-v1", step_latency_ms=1.0), 2), SerialVectorEnv)
    assert isinstance(make_vector_env(EnvSpec(id="Pendulum-v1"), 2), SerialVectorEnv)


# -- pixel envs: built once here for every engine, frames uint8 [H, W, C] ------------------------------


def test_minatar_frames_are_uint8_0_or_255_channels_last() -> None:
    spec = EnvSpec(id="MinAtar/Breakout-v1")  # registered by make_env: gymnasium 1.x loads no entry points
    env = make_env(spec)
    assert env.observation_space == gym.spaces.Box(0, 255, (10, 10, 4), np.uint8)
    obs, _ = env.reset(seed=0)
    assert obs.dtype == np.uint8 and set(np.unique(obs)) <= {0, 255} and obs.any()
    vec = make_vector_env(spec, 3)
    assert isinstance(vec, SerialVectorEnv)
    obs, _ = vec.reset(seed=0)
    vec.action_space.seed(0)
    for _ in range(50):
        obs, *_ = vec.step(vec.action_space.sample())
    assert obs.shape == (3, 10, 10, 4) and obs.dtype == np.uint8


def test_atari_is_preprocessed_to_a_stack_of_four_84x84_uint8_frames() -> None:
    """frameskip=1 in gymnasium.make, AtariPreprocessing (no-op starts, skip 4, max-pool, 84x84 grey), 4 frames
    stacked channels-last; ale-py's own vector env (which would skip this) is not used."""
    spec = EnvSpec(id="ALE/Breakout-v5")
    env = make_env(spec)
    assert env.observation_space == gym.spaces.Box(0, 255, (84, 84, 4), np.uint8)
    assert env.unwrapped._frameskip == 1 and env.unwrapped.spec.kwargs["repeat_action_probability"] == 0.25
    obs, _ = env.reset(seed=0)
    for _ in range(3):
        obs, *_ = env.step(1)  # FIRE
    assert obs.dtype == np.uint8 and obs.shape == (84, 84, 4) and obs.flags.c_contiguous
    # the newest frame is last: the stack shifts by one frame per step
    nxt, *_ = env.step(0)
    np.testing.assert_array_equal(nxt[..., :3], obs[..., 1:])
    assert isinstance(make_vector_env(spec, 2), SerialVectorEnv)
    assert check_env(spec) is None
    assert "Disable frame-skipping" in (check_env(EnvSpec(id="ALE/Breakout-v5", kwargs={"frameskip": 4})) or "")


def test_random_returns_multi_agent_team_is_the_sum_and_reproducible() -> None:
    from crossrl.core.envs import random_returns

    spec = EnvSpec(id="mpe2:simple_spread_v3", kwargs={"N": 3, "max_cycles": 5, "continuous_actions": False},
                   agents="independent")  # fmt: skip
    team, agents = random_returns(spec, episodes=4, seed=3)
    assert list(agents) == ["agent_0", "agent_1", "agent_2"] and all(len(v) == 4 for v in agents.values())
    np.testing.assert_allclose(team, np.sum([agents[a] for a in agents], axis=0))
    assert all(t < 0 for t in team)  # simple_spread's rewards are negative distances
    assert random_returns(spec, episodes=4, seed=3) == (team, agents)
    assert random_returns(spec, episodes=4, seed=4)[0] != team


def test_random_returns_single_agent() -> None:
    from crossrl.core.envs import random_returns

    team, agents = random_returns(EnvSpec(id="CartPole-v1", step_latency_ms=5.0), episodes=5)
    assert agents == {} and len(team) == 5 and all(8 <= r <= 500 for r in team)  # no latency added: fast
    with pytest.raises(ValueError, match="episodes=0"):
        random_returns(EnvSpec(id="CartPole-v1"), episodes=0)


def test_parallel_env_latency_wrapper_is_a_pettingzoo_parallel_env() -> None:
    """The engines' PettingZoo wrappers (TorchRL's PettingZooWrapper, RLlib's ParallelPettingZooEnv) take only a
    ParallelEnv: the latency wrapper is one, and adds its time to every joint step."""
    import time

    from pettingzoo.utils.env import ParallelEnv

    from crossrl.core.envs import make_parallel_env

    spec = EnvSpec(id="mpe2:simple_spread_v3", kwargs={"N": 2, "max_cycles": 5}, agents="shared", step_latency_ms=20)
    env = make_parallel_env(spec)
    assert isinstance(env, ParallelEnv) and env.possible_agents == ["agent_0", "agent_1"]
    env.reset(seed=0)
    t0 = time.perf_counter()
    env.step({a: 0 for a in env.agents})
    assert time.perf_counter() - t0 >= 0.02
    assert env.observation_space("agent_0").shape == (12,)


# -- Dict and Tuple observations: flattened the same way for every engine (they all step make_env) ---------------


class _DictEnv(gym.Env):  # type: ignore[type-arg]
    """One step of a Dict observation; ``bad`` gives the "b" part a wrong shape, ``image`` adds an image part."""

    def __init__(self, bad: bool = False, image: bool = False) -> None:
        parts: dict[str, gym.Space] = {  # type: ignore[type-arg]
            "b": gym.spaces.Box(-1.0, 1.0, (2,), np.float64),
            "a": gym.spaces.Discrete(3),
            "c": gym.spaces.Tuple((gym.spaces.Box(0.0, 5.0, (1,), np.float32), gym.spaces.MultiBinary(2))),
        }
        if image:
            parts["pixels"] = gym.spaces.Box(0, 255, (8, 8, 3), np.uint8)
        self.observation_space = gym.spaces.Dict(parts)
        self.action_space = gym.spaces.Discrete(2)
        self.bad = bad

    def _obs(self) -> dict[str, object]:
        b = np.array([0.25, -0.5, 0.0] if self.bad else [0.25, -0.5])
        return {"b": b, "a": 2, "c": (np.array([4.0], np.float32), np.array([1, 0], np.int8))}

    def reset(self, *, seed: int | None = None, options: dict[str, object] | None = None):  # type: ignore[override]
        return self._obs(), {}

    def step(self, action: object):  # type: ignore[override]
        return self._obs(), 1.0, True, False, {}


for _id, _kw in (("DictObs-v0", {}), ("DictObsBad-v0", {"bad": True}), ("DictObsImage-v0", {"image": True})):
    if _id not in gym.registry:
        gym.register(id=_id, entry_point=_DictEnv, kwargs=_kw)  # type: ignore[arg-type]


def test_dict_observations_flatten_in_sorted_key_order_as_float32() -> None:
    env = make_env(EnvSpec(id="DictObs-v0"))
    obs, _ = env.reset(seed=0)
    # keys sorted: a (Discrete 3, one-hot), b (Box 2), c (Tuple: Box 1, then MultiBinary 2)
    assert env.observation_space.shape == (8,) and env.observation_space.dtype == np.float32
    assert obs.dtype == np.float32
    assert obs.tolist() == [0.0, 0.0, 1.0, 0.25, -0.5, 4.0, 1.0, 0.0]
    assert env.observation_space.contains(obs)
    assert env.observation_space.high.tolist() == [1.0, 1.0, 1.0, 1.0, 1.0, 5.0, 1.0, 1.0]


def test_a_tuple_observation_flattens_in_position_order() -> None:
    pytest.importorskip("spaces_env")
    env = make_env(EnvSpec(id="spaces_env:TupleCartPole-v0"))
    plain = make_env(EnvSpec(id="CartPole-v1"))
    obs, _ = env.reset(seed=3)
    ref, _ = plain.reset(seed=3)
    assert obs.tolist() == [*ref[2:4].tolist(), *ref[0:2].tolist()]  # (pole, cart), as the env gives them


def test_an_observation_off_its_dict_space_is_the_envs_fault() -> None:
    problem = check_env(EnvSpec(id="DictObsBad-v0"))
    assert problem is not None and "does not match its observation space" in problem, problem
    assert "['b'] has shape [3] where its space Box(-1.0, 1.0, (2,), float64) declares [2]" in problem, problem


def test_an_image_inside_a_dict_is_refused_with_what_to_do() -> None:
    problem = check_env(EnvSpec(id="DictObsImage-v0"))
    assert problem is not None
    assert "['pixels']" in problem and "flattens Dict and Tuple observations of vectors only" in problem, problem


def test_a_multidiscrete_policy_samples_each_dimension_and_sums_their_log_probabilities() -> None:
    import torch

    from crossrl.core import algorithms
    from crossrl.scenarios.catalog import HYPERPARAM_DEFAULTS
    from crossrl.scenarios.spec import ModelSpec

    alg = algorithms.load("ppo")
    obs_space = gym.spaces.Box(-1.0, 1.0, (3,), np.float32)
    policy = alg.policy_cls(
        observation_space=obs_space,
        action_space=gym.spaces.MultiDiscrete([2, 3, 4]),
        hyperparams=alg.hyperparams(HYPERPARAM_DEFAULTS["ppo"]),
        model=ModelSpec(hidden=(8,)),
        seed=0,
    )
    obs = np.random.default_rng(0).uniform(-1, 1, (256, 3)).astype(np.float32)
    actions, extra = policy.compute_actions(obs)
    assert actions.shape == (256, 3) and actions.dtype == np.int64
    assert all(set(actions[:, d]) == set(range(n)) for d, n in enumerate((2, 3, 4)))  # every value of each drawn
    logp, entropy, _ = policy.evaluate(torch.as_tensor(obs), torch.as_tensor(actions))
    np.testing.assert_allclose(logp.detach().numpy(), extra["action_logp"], rtol=1e-5, atol=1e-5)
    # near-uniform logits at the start (the head's gain is 0.01): log 24 nats of entropy, log(1/24) per action
    np.testing.assert_allclose(entropy.detach().numpy(), np.log(24.0), atol=1e-2)
    greedy, _ = policy.compute_actions(obs[:4], explore=False)
    logits = policy.net["pi"](torch.as_tensor(obs[:4])).detach().numpy()
    expect = np.stack([part.argmax(1) for part in np.split(logits, [2, 5], axis=1)], axis=1)
    assert (greedy == expect).all()
