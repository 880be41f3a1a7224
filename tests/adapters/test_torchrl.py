"""TorchRL adapter: the hyperparameter mapping table, and tiny real trials on CartPole."""

from __future__ import annotations

import math
from typing import Any

import psutil
import pytest
import torch
import torchrl
from tensordict import TensorDict

from crossrl.adapters.base import ListSink
from crossrl.adapters.registry import BUILTIN
from crossrl.adapters.torchrl.adapter import (
    HYPERPARAM_MAP,
    TorchrlAdapter,
    batched_env,
    completed_episodes,
    frames_per_batch,
    make_torchrl_env,
    mapping_for,
    mapping_markdown,
    unmapped,
)
from crossrl.adapters.torchrl.algorithms import build_learner
from crossrl.scenarios import metrics as M
from crossrl.scenarios.catalog import HYPERPARAM_DEFAULTS
from crossrl.scenarios.spec import TORCHRL_ENVS, EnvSpec, LayoutSpec, ScenarioSpec, Trial

TORCHRL_ALGOS = sorted(BUILTIN["torchrl"].supported)


def make_trial(algorithm: str, *, workers: int = 1, env_steps: int = 2048, envs: int = 4, **hp: Any) -> Trial:
    spec = ScenarioSpec.model_validate(
        {
            "name": "torchrl-test",
            "env": {"id": "CartPole-v1"},
            "algorithm": {"name": algorithm, "hyperparams": hp},
            "engines": ["torchrl"],
            "execution": {"workers": [workers], "envs_per_worker": envs},
            "budget": {"env_steps": env_steps},
            "seeds": [3],
        }
    )
    (trial,) = spec.trials()
    return trial


def _live_children() -> list[psutil.Process]:
    """Child processes still running, but not multiprocessing's own resource tracker (one per parent)."""
    out = []
    for p in psutil.Process().children(recursive=True):
        try:
            if (
                p.is_running()
                and p.status() != psutil.STATUS_ZOMBIE
                and "resource_tracker" not in " ".join(p.cmdline())
            ):
                out.append(p)
        except psutil.NoSuchProcess:
            pass
    return out


def run_and_check(trial: Trial, *, collector: str) -> ListSink:
    """Run the trial for real and check what it reported: the contract every trial must meet."""
    sink = ListSink(trial)
    TorchrlAdapter().run(trial, sink)
    kinds = [m["kind"] for m in sink.messages]
    assert kinds.index("native_config") < kinds.index("setup") < kinds.index("point")
    tags = next(m["tags"] for m in sink.messages if m["kind"] == "tags")
    assert tags["engine_version"] == torchrl.__version__ == "0.14.1"
    assert tags["collector"] == collector
    native = next(m["config"] for m in sink.messages if m["kind"] == "native_config")
    assert native["collector"]["class"] == collector
    assert native["collector"]["kwargs"]["frames_per_batch"] == frames_per_batch(trial)
    assert set(native["hyperparams"]) == set(trial.hyperparams)

    points = sink.points
    steps = [p[M.ENV_STEPS_SAMPLED] for p in points]
    assert steps == sorted(steps) and len(set(steps)) == len(steps), "env_steps_sampled must grow"
    assert trial.budget.env_steps <= steps[-1] < trial.budget.env_steps + 2 * frames_per_batch(trial) * trial.workers
    trained = [p[M.ENV_STEPS_TRAINED] for p in points]
    assert trained == sorted(trained) and trained[-1] > 0
    assert all(p[M.SAMPLE_THROUGHPUT] > 0 for p in points)
    returns = [p[M.EPISODE_RETURN_MEAN] for p in points if M.EPISODE_RETURN_MEAN in p]
    assert returns, "no episode completed"
    assert all(math.isfinite(r) and 1.0 <= r <= 500.0 for r in returns)  # CartPole-v1's range
    assert points[-1][M.EPISODES_TOTAL] >= len(returns)
    # CartPole pays 1 per step, so a return equals its length: checks RewardSum against StepCounter.
    assert all(p[M.EPISODE_RETURN_MEAN] == p[M.EPISODE_LEN_MEAN] for p in points if M.EPISODE_RETURN_MEAN in p)
    for key in (M.TIME_SAMPLE_S, M.TIME_LEARN_S, M.TIME_SYNC_WEIGHTS_S):
        assert all(p[key] >= 0 for p in points)
    losses = [p for p in points if M.VALUE_LOSS in p]
    assert losses and all(math.isfinite(p[M.VALUE_LOSS]) for p in losses)
    assert not _live_children(), "collector processes outlived collector.shutdown()"
    return sink


@pytest.mark.parametrize("algorithm", TORCHRL_ALGOS)
def test_mapping_covers_every_shared_hyperparameter(algorithm: str) -> None:
    assert unmapped(algorithm) == []
    table = mapping_markdown()
    for name in HYPERPARAM_DEFAULTS[algorithm]:
        assert f"`{name}`" in table


def test_mapping_has_one_row_per_name_and_algorithm() -> None:
    seen = [(m.shared, a) for m in HYPERPARAM_MAP for a in m.algorithms]
    assert len(seen) == len(set(seen))
    assert {a for _, a in seen} == set(TORCHRL_ALGOS)
    assert mapping_for("ppo")["clip"].torchrl == "ClipPPOLoss(clip_epsilon=)"
    assert "lmbda" in mapping_for("a2c")["gae_lambda"].torchrl


def test_frames_per_batch_rounds_to_whole_steps_per_env() -> None:
    assert frames_per_batch(make_trial("ppo", workers=2, envs=4, train_batch=4000)) == 4000
    assert frames_per_batch(make_trial("ppo", workers=2, envs=3, train_batch=4000)) == 4002
    assert frames_per_batch(make_trial("a3c", workers=2, envs=4, train_batch=100)) == 100  # per worker
    assert frames_per_batch(make_trial("impala", workers=2, envs=4, rollout_fragment=50)) == 200
    assert frames_per_batch(make_trial("dqn", workers=2, envs=4, rollout_fragment=4)) == 32


def test_completed_episodes_reads_done_steps_only() -> None:
    done = torch.tensor([[False, True, False], [False, False, True]]).unsqueeze(-1)
    data = TensorDict(
        {
            "next": {
                "done": done,
                "episode_reward": torch.tensor([[1.0, 2.0, 1.0], [1.0, 2.0, 3.0]]).unsqueeze(-1),
                "step_count": torch.tensor([[1, 2, 1], [1, 2, 3]]).unsqueeze(-1),
            }
        },
        batch_size=[2, 3],
    )
    assert completed_episodes(data) == ([2.0, 3.0], [2, 3])


def test_prioritized_replay_is_refused_with_the_reason() -> None:
    trial = make_trial("dqn", prioritized_replay=True)
    with pytest.raises(NotImplementedError, match="C\\+\\+ extension.*torch 2.13"):
        TorchrlAdapter().run(trial, ListSink(trial))


def test_ppo_one_worker_cartpole() -> None:
    trial = make_trial("ppo", env_steps=2048, train_batch=512, minibatch=128, epochs=2)
    sink = run_and_check(trial, collector="Collector")
    native = next(m["config"] for m in sink.messages if m["kind"] == "native_config")
    assert native["loss"]["class"] == "ClipPPOLoss"
    assert native["loss"]["kwargs"]["clip_epsilon"] == 0.2
    assert native["value_estimator"] == {"class": "GAE", "kwargs": {"gamma": 0.99, "lmbda": 0.95}}
    assert all(M.POLICY_LOSS in p and M.ENTROPY in p for p in sink.points)
    # ClipPPOLoss's own diagnostics, logged as diag.*
    assert all(0 <= p[M.DIAG_CLIP_FRAC] <= 1 and p[M.DIAG_GRAD_NORM] > 0 for p in sink.points)
    assert all(math.isfinite(p[M.DIAG_APPROX_KL]) for p in sink.points)


def test_dqn_one_worker_cartpole() -> None:
    trial = make_trial("dqn", env_steps=1500, learning_starts=300, buffer_size=5000)
    sink = run_and_check(trial, collector="Collector")
    native = next(m["config"] for m in sink.messages if m["kind"] == "native_config")
    assert native["loss"]["kwargs"]["double_dqn"] is True
    assert native["replay_buffer"]["storage"] == "LazyTensorStorage(5000)"
    # No gradient step before learning_starts env steps.
    assert all(p[M.ENV_STEPS_TRAINED] == 0 for p in sink.points if p[M.ENV_STEPS_SAMPLED] < 300)
    # epsilon anneals from 1 and the replay holds every sampled transition (budget < capacity)
    eps = [p[M.DIAG_EPSILON] for p in sink.points]
    assert eps == sorted(eps, reverse=True) and eps[0] < 1.0 and eps[-1] >= 0.02
    assert all(p[M.DIAG_REPLAY_SIZE] == p[M.ENV_STEPS_SAMPLED] for p in sink.points)


@pytest.mark.integration
def test_ppo_two_workers_cartpole() -> None:
    run_and_check(
        make_trial("ppo", workers=2, env_steps=2048, train_batch=512, epochs=2), collector="MultiSyncCollector"
    )


@pytest.mark.integration
def test_a2c_one_worker_cartpole() -> None:
    run_and_check(make_trial("a2c", env_steps=1500), collector="Collector")


@pytest.mark.integration
def test_a3c_two_workers_async() -> None:
    run_and_check(make_trial("a3c", workers=2, env_steps=1500), collector="MultiAsyncCollector")


@pytest.mark.integration
def test_impala_two_workers_vtrace() -> None:
    sink = run_and_check(make_trial("impala", workers=2, env_steps=2000), collector="MultiAsyncCollector")
    native = next(m["config"] for m in sink.messages if m["kind"] == "native_config")
    assert native["value_estimator"]["class"] == "VTrace"
    assert native["value_estimator"]["kwargs"]["rho_thresh"] == 1.0


@pytest.mark.integration
def test_dqn_two_workers_sync() -> None:
    run_and_check(make_trial("dqn", workers=2, env_steps=1500, learning_starts=300), collector="MultiSyncCollector")


@pytest.mark.parametrize("batched", TORCHRL_ENVS)
def test_each_batched_env_resets_the_envs_that_ended_and_counts_their_episodes(batched: str) -> None:
    """Every batched env a layout may name steps 3 CartPoles that end at different steps: each env's step counter
    and return start again after its own episode ends (TorchRL's partial reset, through gymnasium's reset_mask for
    the vector envs), and a return equals its length (CartPole pays 1 per step)."""
    env = make_torchrl_env(EnvSpec(id="CartPole-v1"), 3, batched=batched)
    try:
        env.set_seed(0)
        data = env.rollout(200, break_when_any_done=False)
    finally:
        env.close()
    steps = data["next", "step_count"].squeeze(-1)
    done = data["next", "done"].squeeze(-1)
    assert steps.shape == (3, 200) and data["observation"].dtype == torch.float32
    assert bool(done.any(dim=1).all()), "random actions end every CartPole episode within 200 steps"
    assert not bool((done[0] == done[1]).all() and (done[1] == done[2]).all()), "the envs end apart"
    expected = torch.where(done[:, :-1], torch.ones_like(steps[:, 1:]), steps[:, :-1] + 1)
    assert torch.equal(steps[:, 1:], expected) and torch.equal(steps[:, 0], torch.ones(3, dtype=steps.dtype))
    assert torch.equal(data["next", "episode_reward"].squeeze(-1), steps.to(torch.float32))


def test_the_vector_envs_give_float32_observations_of_a_float64_env() -> None:
    """MuJoCo's observations are float64; every batched env hands the networks float32, as the engines' do."""
    env = make_torchrl_env(EnvSpec(id="InvertedPendulum-v5", actions="unit"), 2, batched="gym_sync")
    try:
        data = env.rollout(5, break_when_any_done=False)
    finally:
        env.close()
    assert data["observation"].dtype == torch.float32 and data["observation"].shape == (2, 5, 4)


def test_a_trial_names_its_batched_env_in_its_native_config() -> None:
    spec = ScenarioSpec.model_validate(
        {
            "name": "torchrl-test",
            "env": {"id": "CartPole-v1"},
            "algorithm": {"name": "ppo", "hyperparams": {"train_batch": 256, "minibatch": 128, "epochs": 1}},
            "engines": ["torchrl"],
            "execution": {"envs_per_worker": 2, "layout": {"torchrl": {"env": "SerialEnv"}}},
            "budget": {"env_steps": 512},
        }
    )
    (trial,) = spec.trials()
    assert trial.layout == {"env": "SerialEnv"}
    sink = run_and_check(trial, collector="Collector")
    native = next(m["config"] for m in sink.messages if m["kind"] == "native_config")
    assert native["layout"] == {"env": "SerialEnv"} and native["env"].startswith("TransformedEnv(SerialEnv(2 x")
    (default,) = spec.model_copy(
        update={"execution": spec.execution.model_copy(update={"layout": LayoutSpec()})}
    ).trials()
    assert default.layout == {"env": None} and batched_env(default.layout) == "gym_sync"


# -- continuous (Box) actions for the on-policy learners ----------------------------------------------------------


def pendulum_trial(algorithm: str, *, workers: int = 1, env_steps: int = 800, **hp: Any) -> Trial:
    spec = ScenarioSpec.model_validate(
        {
            "name": "torchrl-box",
            "env": {"id": "Pendulum-v1"},
            "algorithm": {"name": algorithm, "hyperparams": hp, "model": {"hidden": [32, 32], "activation": "tanh"}},
            "engines": ["torchrl"],
            "execution": {"workers": [workers], "envs_per_worker": 2},
            "budget": {"env_steps": env_steps},
            "seeds": [1],
        }
    )
    (trial,) = spec.trials()
    return trial


def run_box_trial(trial: Trial) -> ListSink:
    """Runs a Pendulum trial for real; checks its points and losses are finite and its final policy's actions lie
    within Pendulum's bounds [-2, 2] (the mean clipped)."""
    sink = ListSink(trial)
    TorchrlAdapter().run(trial, sink)
    points = sink.points
    assert points and points[-1][M.ENV_STEPS_SAMPLED] >= trial.budget.env_steps
    assert points[-1][M.ENV_STEPS_TRAINED] > 0
    returns = [p[M.EPISODE_RETURN_MEAN] for p in points if M.EPISODE_RETURN_MEAN in p]
    assert returns and all(-1700.0 <= r <= 0.0 for r in returns)  # Pendulum-v1's range over 200 steps
    losses = [p for p in points if M.VALUE_LOSS in p]
    assert losses and all(math.isfinite(p[k]) for p in losses for k in (M.VALUE_LOSS, M.POLICY_LOSS, M.ENTROPY))
    native = next(m["config"] for m in sink.messages if m["kind"] == "native_config")
    assert native["actor"]["distribution"].startswith("IndependentNormal")
    assert not _live_children(), "collector processes outlived collector.shutdown()"
    return sink


def test_ppo_pendulum_gaussian_head() -> None:
    """PPO on Pendulum-v1's Box actions, 1 worker, 800 env steps (~5 s)."""
    sink = run_box_trial(pendulum_trial("ppo", train_batch=400, minibatch=100, epochs=2))
    native = next(m["config"] for m in sink.messages if m["kind"] == "native_config")
    assert native["loss"]["class"] == "ClipPPOLoss"
    assert all(math.isfinite(p[M.DIAG_APPROX_KL]) for p in sink.points)


@pytest.mark.integration
def test_impala_pendulum_gaussian_head_vtrace() -> None:
    """IMPALA (V-trace on the taken actions' Gaussian log-probabilities) on Pendulum-v1, 2 async workers, 800 env
    steps (~25 s on a loaded machine: two collector processes start)."""
    sink = run_box_trial(pendulum_trial("impala", workers=2, train_batch=200, rollout_fragment=50))
    native = next(m["config"] for m in sink.messages if m["kind"] == "native_config")
    assert native["value_estimator"]["class"] == "VTrace"


def test_a2c_pendulum_gaussian_head() -> None:
    """A2C on Pendulum-v1's Box actions, 1 worker, 800 env steps (~1 s)."""
    run_box_trial(pendulum_trial("a2c", train_batch=200))


@pytest.mark.parametrize("algorithm", ["ppo", "a2c", "a3c", "impala"])
def test_gaussian_head_has_crossrl_parameter_count_and_initial_std(algorithm: str) -> None:
    """The same head as crossrl's core (mean MLP, a state-independent log std per action starting at 0, the critic
    apart): equal parameter counts, std 1 at the start."""
    from engine_models import crossrl_nets

    from crossrl.adapters.torchrl.adapter import learner_dims
    from crossrl.core.models import count_params

    trial = pendulum_trial(algorithm)
    dims = learner_dims(trial.env)
    assert dims == {"obs_shape": (3,), "action_shape": (1,), "action_low": [-2.0], "action_high": [2.0]}
    learner: Any = build_learner(trial=trial, **dims)
    policy, _ = crossrl_nets(trial)
    ours = count_params(policy.net)
    assert (
        count_params(learner.actor) + count_params(learner.critic)
        == ours
        == 2 * (3 * 32 + 32 + 32 * 32 + 32 + 32 + 1) + 1
    )
    assert torch.equal(learner.log_std().detach(), torch.zeros(1))
    td = TensorDict({"observation": torch.zeros(5, 3)}, batch_size=[5])
    dist = learner.actor.get_dist(td)
    assert torch.allclose(dist.stddev, torch.ones(5, 1))
    assert dist.log_prob(torch.zeros(5, 1)).shape == (5,)  # summed over the action dimensions


def test_box_actions_are_clipped_to_the_bounds_for_the_env_and_kept_as_sampled() -> None:
    """The env steps with the action clipped (as crossrl's evaluators np.clip it), the collected action stays the
    sampled one: an action of 9 gives what 2 gives, and the rollout keeps the 9."""
    outs = []
    for value in (9.0, 2.0):
        env = make_torchrl_env(EnvSpec(id="Pendulum-v1"), 1, batched="gym_sync")
        env.set_seed(0)
        td = env.reset()
        td["action"] = torch.full((1, 1), value)
        # what the env is handed (Pendulum also clips its torque itself, so this is what tells ClipActions works)
        assert env.transform.inv(td.clone())["action"].item() == min(value, 2.0)
        outs.append(env.step(td))
        env.close()
    assert outs[0]["action"].item() == 9.0
    assert torch.equal(outs[0]["next", "observation"], outs[1]["next", "observation"])
    assert torch.equal(outs[0]["next", "reward"], outs[1]["next", "reward"])


def test_box_policy_reloads_from_a_checkpoint_as_the_clipped_mean(tmp_path: Any) -> None:
    """``load_policy`` (crossrl evaluate) rebuilds the Gaussian policy from a checkpoint: deterministic, the mean
    clipped to [-2, 2]; sampled, within the bounds too."""
    import numpy as np

    from crossrl.adapters.torchrl.adapter import learner_dims, load_policy

    trial = pendulum_trial("ppo")
    learner: Any = build_learner(trial=trial, **learner_dims(trial.env))
    with torch.no_grad():  # a mean far outside the bounds for some observations
        learner.actor_net[-1].weight.fill_(3.0)
        learner.log_std().fill_(-1.0)
    learner.save(tmp_path)
    greedy, sample = load_policy(trial, tmp_path), load_policy(trial, tmp_path, greedy=False)
    rng = np.random.default_rng(0)
    for obs in rng.uniform(-1, 1, (20, 3)).astype(np.float32):
        with torch.no_grad():
            mean = learner.actor_net(torch.as_tensor(obs)[None])[0].numpy()
        a = greedy(obs)
        assert a.dtype == np.float32 and a.shape == (1,)
        assert np.array_equal(a, np.clip(mean, -2.0, 2.0))
        assert -2.0 <= sample(obs)[0] <= 2.0
