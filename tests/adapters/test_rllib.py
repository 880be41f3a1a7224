"""RLlib adapter: the hyperparameter mapping table, resource planning, result parsing, tiny real runs."""

from __future__ import annotations

import math
import time
from typing import Any

import pytest
from ray_state import run_leaving_ray_as_found

from crossrl.adapters.base import ListSink
from crossrl.adapters.registry import BUILTIN
from crossrl.adapters.rllib import adapter as R
from crossrl.scenarios import metrics as M
from crossrl.scenarios.catalog import HYPERPARAM_DEFAULTS
from crossrl.scenarios.spec import Hyperparams, ScenarioSpec, Trial

# RLlib runs in this process join one kept Ray (tests/conftest.py) instead of starting their own
pytestmark = pytest.mark.usefixtures("ray_cluster")

RLLIB_ALGORITHMS = sorted(BUILTIN["rllib"].supported)


def make_trial(
    algorithm: str,
    *,
    workers: int = 1,
    env_steps: int = 2000,
    envs_per_worker: int = 1,
    hyperparams: dict[str, Any] | None = None,
    layout: dict[str, Any] | None = None,
) -> Trial:
    spec = ScenarioSpec.model_validate(
        {
            "name": "rllib-test",
            "env": {"id": "CartPole-v1"},
            "algorithm": {
                "name": algorithm,
                "hyperparams": hyperparams or {},
                "model": {"hidden": [32, 16], "activation": "relu"},
            },
            "engines": ["rllib"],
            "execution": {"workers": [workers], "envs_per_worker": envs_per_worker, "layout": layout or {}},
            "budget": {"env_steps": env_steps},
            "seeds": [3],
        }
    )
    (trial,) = spec.trials()
    return trial


# -- the mapping table --------------------------------------------------------------------------


def test_rllib_runs_exactly_the_mapped_algorithms() -> None:
    assert sorted(R.HYPERPARAM_MAP) == RLLIB_ALGORITHMS == sorted(R.NOT_EQUALIZABLE)


@pytest.mark.parametrize("algorithm", RLLIB_ALGORITHMS)
def test_mapping_covers_every_shared_hyperparameter(algorithm: str) -> None:
    used = set(HYPERPARAM_DEFAULTS[algorithm])
    covered = set(R.HYPERPARAM_MAP[algorithm]) | set(R.NOT_EQUALIZABLE[algorithm])
    assert used <= covered, f"{algorithm}: unmapped {sorted(used - covered)}"
    # Mapped names are real shared names (a typo would map nothing).
    assert covered <= set(Hyperparams.model_fields)
    assert not set(R.HYPERPARAM_MAP[algorithm]) & set(R.NOT_EQUALIZABLE[algorithm])


def test_mapping_rows_list_every_name_once() -> None:
    rows = R.mapping_rows()
    for algorithm in RLLIB_ALGORITHMS:
        names = [name for algo, name, _, _ in rows if algo == algorithm]
        assert sorted(names) == sorted(set(R.HYPERPARAM_MAP[algorithm]) | set(R.NOT_EQUALIZABLE[algorithm]))
    assert ("impala", "vtrace_clip_c", "(none)") in [r[:3] for r in rows]


def test_unmapped_hyperparameter_is_refused() -> None:
    trial = make_trial("ppo")
    extra = trial.model_copy(update={"hyperparams": {**trial.hyperparams, "buffer_size": 10}})
    with pytest.raises(ValueError, match="buffer_size.*no RLlib mapping"):
        R.check_covered(extra)


def test_value_rllib_cannot_take_is_refused() -> None:
    with pytest.raises(ValueError, match=r"vtrace_clip_c=0.5 cannot be set.*c-bar"):
        R.check_covered(make_trial("impala", hyperparams={"vtrace_clip_c": 0.5}))
    R.check_covered(make_trial("impala", hyperparams={"vtrace_clip_c": 1.0}))


# Non-default values, so a setting that is not passed on would show.
_NON_DEFAULT = {
    "ppo": {
        "lr": 1.25e-3,
        "gamma": 0.97,
        "gae_lambda": 0.9,
        "clip": 0.3,
        "vf_clip": 5.0,
        "train_batch": 640,
        "minibatch": 64,
        "epochs": 3,
        "entropy_coeff": 0.02,
        "vf_coeff": 0.7,
        "grad_clip": 1.5,
        "rollout_fragment": 80,
    },
    "impala": {"lr": 1e-3, "gamma": 0.95, "vtrace_clip_rho": 0.8, "vf_coeff": 0.25, "train_batch": 400},
    "dqn": {
        "lr": 1e-3,
        "buffer_size": 7000,
        "learning_starts": 300,
        "target_update": 250,
        "n_step": 3,
        "epsilon_initial": 0.9,
        "epsilon_final": 0.05,
        "epsilon_timesteps": 4000,
        "double_q": False,
        "prioritized_replay": True,
        "priority_alpha": 0.5,
        "priority_beta": 0.3,
        "train_batch": 64,
    },
    "sac": {
        "actor_lr": 1e-4,
        "critic_lr": 2e-3,
        "alpha_lr": 5e-4,
        "gamma": 0.95,
        "tau": 0.02,
        "train_batch": 64,
        "buffer_size": 7000,
        "learning_starts": 300,
        "n_step": 2,
        "target_entropy": -0.5,
        "initial_alpha": 0.3,
        "rollout_fragment": 2,
    },
    "dreamer": {
        "model_size": "micro",
        "training_ratio": 64.0,
        "batch_size_B": 8,
        "batch_length_T": 32,
        "horizon_H": 10,
        "gamma": 0.99,
        "gae_lambda": 0.9,
        "world_model_lr": 2e-4,
        "actor_lr": 4e-5,
        "critic_lr": 5e-5,
        "entropy_scale": 1e-3,
        "buffer_size": 7000,
    },
}


@pytest.mark.parametrize("algorithm", RLLIB_ALGORITHMS)
def test_config_carries_every_mapped_value(algorithm: str) -> None:
    trial = make_trial(algorithm, workers=2, envs_per_worker=2, hyperparams=_NON_DEFAULT[algorithm])
    plan = R.plan_resources(algorithm=algorithm, workers=2, available_cpus=2)
    config = R.build_config(trial, plan=plan, env_name="unused")
    checked = 0
    for name, path in R.HYPERPARAM_MAP[algorithm].items():
        if name in R.TRANSFORMED or name not in trial.hyperparams:
            continue
        assert R._resolve(config, path) == trial.hp(name), (name, path)
        checked += 1
    assert checked >= 8 if algorithm != "impala" else checked >= 6
    model = config.model_config
    assert model["fcnet_hiddens"] == [32, 16] and model["fcnet_activation"] == "relu"
    assert model["head_fcnet_hiddens"] == [] and model["vf_share_layers"] is False
    assert config.seed == 3
    assert (config.num_env_runners, config.num_envs_per_env_runner) == (2, 2)
    assert config.num_learners == 0
    native = R.native_config(config)
    assert native["_model_config"]["fcnet_hiddens"] == [32, 16]
    assert "model" not in native


# Hand-computed for CartPole (4 obs, 2 actions) and hidden (32, 16): an MLP is 4*32+32 + 32*16+16
# = 688 parameters; policy head 16*2+2 = 34; value head 16+1 = 17. PPO/IMPALA: separate actor and
# critic MLPs; DQN: one MLP and a linear Q head (no dueling).
@pytest.mark.parametrize(("algorithm", "n_params"), [("ppo", 2 * 688 + 34 + 17), ("impala", 1427), ("dqn", 722)])
def test_rl_module_is_the_spec_mlp(algorithm: str, n_params: int) -> None:
    import gymnasium as gym

    trial = make_trial(algorithm)
    config = R.build_config(
        trial, plan=R.plan_resources(algorithm=algorithm, workers=1, available_cpus=2), env_name="x"
    )
    env = gym.make("CartPole-v1")
    spec = config.rl_module_spec
    spec.observation_space, spec.action_space, spec.model_config = (
        env.observation_space,
        env.action_space,
        config.model_config,
    )
    module = spec.build()
    assert sum(p.numel() for p in module.parameters()) == n_params
    relu = [m for m in module.modules() if type(m).__name__ == "ReLU"]
    assert len(relu) == (4 if algorithm != "dqn" else 2)


def test_env_creator_builds_the_spec_env_with_latency() -> None:
    from crossrl.core.envs import StepLatency

    env = R.env_creator({"env_spec": {"id": "CartPole-v1", "step_latency_ms": 2.0}})
    assert isinstance(env, StepLatency) and env.spec is not None and env.spec.id == "CartPole-v1"
    env.reset(seed=0)
    t0 = time.perf_counter()
    for _ in range(5):
        env.step(0)
    assert time.perf_counter() - t0 >= 5 * 0.002


def test_dqn_transformed_settings() -> None:
    from ray.rllib.algorithms.dqn.dqn import calculate_rr_weights

    trial = make_trial("dqn", hyperparams=_NON_DEFAULT["dqn"])
    config = R.build_config(trial, plan=R.plan_resources(algorithm="dqn", workers=1, available_cpus=2), env_name="x")
    assert config.replay_buffer_config["type"] == "PrioritizedEpisodeReplayBuffer"
    uniform = make_trial("dqn", hyperparams={"prioritized_replay": False})
    assert R.training_settings(uniform, num_env_runners=1)["replay_buffer_config"] == {
        "capacity": 50_000,
        "type": "EpisodeReplayBuffer",
    }
    # replay_ratio 1.0 with defaults (batch 32, fragment 4, one runner, one env): RLlib alternates
    # 8 sample rounds of 4 steps with one update of 32 rows, i.e. trained/sampled = 1.
    default = make_trial("dqn")
    config = R.build_config(default, plan=R.plan_resources(algorithm="dqn", workers=1, available_cpus=2), env_name="x")
    store, train = calculate_rr_weights(config)
    sampled = store * config.get_rollout_fragment_length() * config.num_envs_per_env_runner
    assert train * config.total_train_batch_size / sampled == pytest.approx(default.hp("replay_ratio"))


def test_impala_uses_one_rho_bar_for_both_clips() -> None:
    settings = R.training_settings(make_trial("impala", hyperparams={"vtrace_clip_rho": 0.7}), num_env_runners=1)
    assert settings["vtrace_clip_rho_threshold"] == settings["vtrace_clip_pg_rho_threshold"] == 0.7


# -- resources ---------------------------------------------------------------------------------


def test_impala_learner_is_local_when_runners_take_every_cpu() -> None:
    assert R.plan_resources(algorithm="impala", workers=2, available_cpus=2).num_learners == 0
    assert R.plan_resources(algorithm="impala", workers=1, available_cpus=2).num_learners == 1
    assert R.plan_resources(algorithm="ppo", workers=1, available_cpus=2).num_learners == 0


def test_more_runners_than_cpus_share_them() -> None:
    plan = R.plan_resources(algorithm="ppo", workers=8, available_cpus=2)
    assert plan.cpus_per_env_runner == 0.25 and plan.num_env_runners == 8
    thirds = R.plan_resources(algorithm="impala", workers=3, available_cpus=2)
    assert thirds.cpus_per_env_runner == 0.6666 and thirds.num_learners == 0


def test_request_that_cannot_fit_raises_instead_of_hanging() -> None:
    with pytest.raises(RuntimeError, match=r"64 env runners cannot fit.*Fix:"):
        R.plan_resources(algorithm="impala", workers=64, available_cpus=2)
    with pytest.raises(RuntimeError, match="cannot fit"):
        R.plan_resources(algorithm="ppo", workers=1, available_cpus=0)


# -- result parsing ----------------------------------------------------------------------------


def test_result_to_point_reads_raw_episodes_and_losses() -> None:
    result = {
        "env_runners": {
            "num_env_steps_sampled_lifetime": 1024.0,
            "episode_return_mean": 99.0,  # smoothed window: must not be used
            R._ITEM_KEY: [(10.0, 10), (30.0, 30)],
        },
        "learners": {
            "default_policy": {
                "mean_pi_loss": -0.5,
                "pi_loss": -50.0,
                "mean_vf_loss": 2.0,
                "entropy": 0.6,
                "num_module_steps_trained_lifetime": 900.0,
                "diff_num_grad_updates_vs_sampler_policy": 1.5,
                "gradients_default_optimizer_global_norm": float("nan"),  # IMPALA: NaN means no update, dropped
            },
        },
        "timers": {"env_runner_sampling_timer": 0.3, "learner_update_timer": 0.1, "synch_weights": 0.01},
        "fault_tolerance": {"num_remote_worker_restarts": 0},
    }
    point = R.result_to_point(result, algorithm="impala")
    assert point["env_steps_sampled"] == 1024 and point["env_steps_trained"] == 900
    assert point["episode_returns"] == [10.0, 30.0] and point["episode_lengths"] == [10, 30]
    v = point["values"]
    assert (v[M.POLICY_LOSS], v[M.VALUE_LOSS], v[M.ENTROPY]) == (-0.5, 2.0, 0.6)
    assert v[M.TIME_SAMPLE_S] == 0.3 and v[M.WORKER_RESTARTS] == 0
    assert v[M.DIAG_POLICY_LAG] == 1.5 and M.DIAG_GRAD_NORM not in v and M.DIAG_APPROX_KL not in v
    # PPO leaves env_steps_trained to the sink (= sampled); a missing item list means no episodes.
    ppo = R.result_to_point({"num_env_steps_sampled_lifetime": 7}, algorithm="ppo")
    assert ppo["env_steps_sampled"] == 7 and ppo["env_steps_trained"] is None and ppo["episode_returns"] == []


def test_an_iteration_without_updates_leaves_its_nan_stats_out_and_a_diverged_one_keeps_them() -> None:
    """A learner restored from a checkpoint reports NaN for every stat (rows trained included) of an iteration that
    made no update (measured: SAC refilling a buffer left out of its checkpoint); with rows trained, NaN is kept for
    the sink to fail the trial."""
    nan = float("nan")
    idle = {"num_module_steps_trained": nan, "num_module_steps_trained_lifetime": 4000.0, "policy_loss": nan,
            "qf_loss": nan, "qf_twin_loss": nan, "logps": nan, "qf_mean": nan}  # fmt: skip
    point = R.result_to_point({"learners": {"default_policy": idle}}, algorithm="sac")
    assert not {M.POLICY_LOSS, M.VALUE_LOSS, M.ENTROPY, M.DIAG_Q_MEAN} & set(point["values"])
    diverged = {**idle, "num_module_steps_trained": 4000}
    values = R.result_to_point({"learners": {"default_policy": diverged}}, algorithm="sac")["values"]
    assert math.isnan(values[M.POLICY_LOSS]) and math.isnan(values[M.VALUE_LOSS])


def test_episode_pairs_flattened_by_rllibs_merge_are_still_read() -> None:
    """Seen once in a 150k-step DQN run: the (return, length) tuples arrived as consecutive scalars."""
    items = [(10.0, 10), 22.0, 22, (5.0, 5), 7.0, 7]
    result = {"num_env_steps_sampled_lifetime": 7, "env_runners": {R._ITEM_KEY: items}}
    point = R.result_to_point(result, algorithm="dqn")
    assert point["episode_returns"] == [10.0, 22.0, 5.0, 7.0] and point["episode_lengths"] == [10, 22, 5, 7]


# -- tiny real runs ------------------------------------------------------------------------------


def _check_run(sink: ListSink, trial: Trial, *, max_return: float) -> list[dict[str, float]]:
    points = sink.points
    assert points, "no point was reported"
    steps = [p[M.ENV_STEPS_SAMPLED] for p in points]
    assert steps == sorted(steps) and steps[-1] >= trial.budget.env_steps
    returns = [p[M.EPISODE_RETURN_MEAN] for p in points if M.EPISODE_RETURN_MEAN in p]
    assert returns and all(math.isfinite(r) and 1 <= r <= max_return for r in returns)
    assert all(p[M.SAMPLE_THROUGHPUT] >= 0 for p in points) and max(p[M.SAMPLE_THROUGHPUT] for p in points) > 0
    assert points[-1][M.EPISODES_TOTAL] >= 5
    native = [m["config"] for m in sink.messages if m["kind"] == "native_config"]
    assert len(native) == 1 and native[0]["num_env_runners"] == trial.workers
    assert native[0]["_model_config"]["fcnet_hiddens"] == list(trial.model.hidden)
    (tags,) = [m["tags"] for m in sink.messages if m["kind"] == "tags"]
    import ray

    assert tags["engine_version"] == ray.__version__
    assert tags["ray_gcs_address"].startswith("127.0.0.1:"), "a local cluster must stay on loopback"
    assert sink.setup_s is not None and sink.setup_s > 0
    return points


@pytest.mark.parametrize("workers", [1, pytest.param(2, marks=pytest.mark.integration)])
def test_tiny_ppo_cartpole(workers: int) -> None:
    """One env runner in the default layout (SYNC); two of 2 envs each in CartPole's own vector class
    (execution.layout.rllib.vectorize: VECTOR_ENTRY_POINT)."""
    native_vector = workers == 2
    trial = make_trial(
        "ppo",
        workers=workers,
        env_steps=1024,
        envs_per_worker=2 if native_vector else 1,
        hyperparams={"train_batch": 256, "minibatch": 64, "epochs": 2, "rollout_fragment": 32},
        layout={"rllib": {"vectorize": "VECTOR_ENTRY_POINT"}} if native_vector else None,
    )
    sink = ListSink(trial)
    run_leaving_ray_as_found(R.RllibAdapter(), trial, sink)
    points = _check_run(sink, trial, max_return=500)
    assert len(points) == 4  # 256 env steps per iteration, exactly
    (native,) = [m["config"] for m in sink.messages if m["kind"] == "native_config"]
    (tags,) = [m["tags"] for m in sink.messages if m["kind"] == "tags"]
    mode = "vector_entry_point" if native_vector else "sync"
    assert str(native["gym_env_vectorize_mode"]).lower().endswith(mode), native["gym_env_vectorize_mode"]
    assert tags["layout"] == ("2 runners x 2 native vector" if native_vector else "1 runner x 1 SYNC")
    assert all(M.POLICY_LOSS in p and M.VALUE_LOSS in p and M.ENTROPY in p for p in points)
    assert all(p[M.DIAG_APPROX_KL] >= 0 and p[M.DIAG_GRAD_NORM] > 0 for p in points)  # RLlib's own diagnostics


@pytest.mark.integration
def test_tiny_impala_cartpole() -> None:
    trial = make_trial("impala", workers=2, env_steps=2000)
    sink = ListSink(trial)
    run_leaving_ray_as_found(R.RllibAdapter(), trial, sink)
    points = _check_run(sink, trial, max_return=500)
    assert any(M.POLICY_LOSS in p for p in points)
    assert any(t["kind"] == "tags" and "local learner" in t["tags"]["rllib_resources"] for t in sink.messages)


@pytest.mark.integration
@pytest.mark.usefixtures("own_ray")  # the adapter starts its Ray and shuts it down
def test_tiny_dqn_cartpole() -> None:
    trial = make_trial(
        "dqn", env_steps=1500, hyperparams={"learning_starts": 500, "rollout_fragment": 8, "replay_ratio": 1.0}
    )
    sink = ListSink(trial)
    run_leaving_ray_as_found(R.RllibAdapter(), trial, sink)
    points = _check_run(sink, trial, max_return=500)
    trained = [p[M.ENV_STEPS_TRAINED] for p in points]
    assert trained == sorted(trained) and trained[-1] > 0
    # replay_ratio 1: trained/sampled stays near 1 once learning started (RLlib rounds the rounds).
    assert 0.3 < trained[-1] / (points[-1][M.ENV_STEPS_SAMPLED] - 500) < 3
    assert any(M.VALUE_LOSS in p for p in points)
    sizes = [p[M.DIAG_REPLAY_SIZE] for p in points if M.DIAG_REPLAY_SIZE in p]
    assert sizes and 0 < sizes[-1] <= points[-1][M.ENV_STEPS_SAMPLED]
