"""Engine-native settings (the spec's ``native``) reach each engine's own objects, built through the adapters'
builders with a tiny spec (no Ray, no training): RLlib's AlgorithmConfig, TorchRL's loss, Adam and collector, crossrl's
policy; a resumed trial keeps a native learning rate."""

from __future__ import annotations

from typing import Any

import pytest

from crossrl.scenarios.spec import ScenarioSpec, Trial


def make_trial(engine: str, native: dict[str, Any], algorithm: str = "ppo") -> Trial:
    spec = ScenarioSpec.model_validate(
        {
            "name": "native-test",
            "env": {"id": "CartPole-v1"},
            "algorithm": {"name": algorithm, "model": {"hidden": [16], "activation": "tanh"}},
            "engines": [engine],
            "budget": {"env_steps": 1000},
            "native": {engine: native},
        }
    )
    (trial,) = spec.trials()
    return trial


def test_rllib_config_takes_the_native_values_over_crossrls() -> None:
    from crossrl.adapters.rllib import adapter as R

    trial = make_trial(
        "rllib", {"training": {"vf_clip_param": 5.0, "lr": 1.0e-3}, "env_runners": {"rollout_fragment_length": 50}}
    )
    plan = R.plan_resources(algorithm="ppo", workers=1, available_cpus=2)
    config = R.build_config(trial, plan=plan, env_name="unused")
    assert config.vf_clip_param == 5.0  # crossrl's own vf_clip (10) is set first, the native value wins
    assert config.lr == 1.0e-3 and config.rollout_fragment_length == 50
    native = R.native_config(config)
    assert native["vf_clip_param"] == 5.0 and native["rollout_fragment_length"] == 50
    assert R.trial_learning_rates(trial) == 1.0e-3  # a resumed trial re-applies the native lr, not the spec's
    assert R.native_problems("ppo", trial.native) == []


def test_rllib_sac_resume_keeps_native_learning_rates() -> None:
    from crossrl.adapters.rllib import adapter as R

    trial = make_trial("rllib", {"training": {"actor_lr": 1.0e-4}}, algorithm="sac")
    lrs = R.trial_learning_rates(trial)
    assert isinstance(lrs, dict) and lrs["policy"] == 1.0e-4 and lrs["qf"] == trial.hp("critic_lr")


def test_torchrl_loss_optimizer_and_collector_take_the_native_values() -> None:
    from crossrl.adapters.torchrl.adapter import env_dims, local_collector, native_kwargs, native_problems
    from crossrl.adapters.torchrl.algorithms import build_learner

    native = {
        "loss": {"clip_value": 0.5, "entropy_coeff": 0.02},
        "optimizer": {"eps": 1.0e-5, "lr": 1.0e-3},
        "collector": {"reset_at_each_iter": True},
    }
    trial = make_trial("torchrl", native)
    assert native_problems(trial) == []
    obs_shape, n_actions = env_dims(trial.env)
    learner: Any = build_learner(trial=trial, obs_shape=obs_shape, n_actions=n_actions)
    assert float(learner.loss.clip_value) == 0.5
    assert float(learner.loss.entropy_coeff) == pytest.approx(0.02)
    assert learner.loss_kwargs["clip_epsilon"] == trial.hp("clip")  # crossrl's own kwargs stay where not overridden
    assert learner.optim.defaults["eps"] == 1.0e-5 and learner.optim.defaults["lr"] == 1.0e-3
    assert learner.native()["loss"]["kwargs"]["clip_value"] == 0.5
    # a resumed learner keeps the native lr (load_optimizer re-applies the trial's learning rate)
    state = learner.state_dict()
    for group in learner.optim.param_groups:
        group["lr"] = 0.5
    learner.load_state_dict(state)
    assert {g["lr"] for g in learner.optim.param_groups} == {1.0e-3}
    collector, desc = local_collector(
        trial.env, workers=1, envs_per_worker=1, policy=learner.policy, frames_per_batch=16,
        native=native_kwargs(trial, "collector"),
    )  # fmt: skip
    try:
        assert collector.reset_at_each_iter is True and desc["kwargs"]["reset_at_each_iter"] is True
    finally:
        collector.shutdown()


def test_torchrl_sac_native_optimizer_applies_to_each_adam() -> None:
    from crossrl.adapters.torchrl.algorithms import build_learner

    trial = make_trial("torchrl", {"optimizer": {"eps": 1.0e-4}, "loss": {"min_alpha": 1.0e-3}}, algorithm="sac")
    learner: Any = build_learner(trial=trial, obs_shape=(3,), action_shape=(1,), action_low=[-1.0],
                                 action_high=[1.0])  # fmt: skip
    assert {o.defaults["eps"] for o in learner.optims.values()} == {1.0e-4}
    assert learner.loss_kwargs["min_alpha"] == 1.0e-3


def test_crossrl_core_takes_its_native_settings() -> None:
    from crossrl.core import algorithms
    from crossrl.core.envs import make_env

    trial = make_trial("crossrl", {"settings": {"adam_eps": 1.0e-3}})
    alg = algorithms.load("ppo")
    hp = alg.hyperparams(trial.hyperparams, trial.native.get("settings"))
    env = make_env(trial.env)
    policy = alg.policy_cls(observation_space=env.observation_space, action_space=env.action_space, hyperparams=hp,
                            model=trial.model, seed=0)  # fmt: skip
    env.close()
    assert policy.optimizer.defaults["eps"] == 1.0e-3


def test_sac_search_values_reach_every_engines_own_objects() -> None:
    """pendulum-sac's search space (actor_lr, critic_lr, tau): values drawn inside its bounds, put over a trial's
    hyperparameters as a search's trainable puts them (``crossrl.orchestration.tuning``), reach each engine's own
    objects under SAC's names there: RLlib's config, TorchRL's Adams and SoftUpdate, the core's Adams and Polyak
    step. (A search's drawing and recording is the same for every algorithm: `tests/integration/test_tune.py`.)"""
    import gymnasium as gym

    from crossrl.adapters.rllib import adapter as R
    from crossrl.adapters.torchrl.algorithms import build_learner
    from crossrl.core import algorithms
    from crossrl.orchestration.tuning import bounds_of
    from crossrl.scenarios.loader import load

    spec, _ = load("pendulum-sac")
    assert spec.search is not None
    bounds = bounds_of(spec.search)
    names = ("actor_lr", "critic_lr", "tau")
    assert set(names) <= set(spec.search.space) and 0.01 in (spec.search.space["tau"].choice or [])
    # a point inside each bound that is no catalog default: 0.37 of the way up each range (tau: 0.01 if a choice)
    drawn = {n: bounds[n][0] + 0.37 * (bounds[n][1] - bounds[n][0]) if n in bounds else 0.01 for n in names}
    trials = {t.engine: t.model_copy(update={"hyperparams": {**t.hyperparams, **drawn}}) for t in spec.trials()}
    assert set(trials) == {"crossrl", "rllib", "torchrl"}

    config = R.build_config(trials["rllib"], plan=R.plan_resources(algorithm="sac", workers=1, available_cpus=2),
                            env_name="unused")  # fmt: skip
    assert (config.actor_lr, config.critic_lr, config.tau) == pytest.approx(tuple(drawn.values()))

    learner: Any = build_learner(trial=trials["torchrl"], obs_shape=(3,), action_shape=(1,), action_low=[-1.0],
                                 action_high=[1.0])  # fmt: skip
    assert [g["lr"] for g in learner.optims["actor"].param_groups] == pytest.approx([drawn["actor_lr"]])
    assert [g["lr"] for g in learner.optims["critic"].param_groups] == pytest.approx([drawn["critic_lr"]])
    assert learner.target.eps == pytest.approx(1 - drawn["tau"])

    trial = trials["crossrl"]
    alg = algorithms.load("sac")
    box = gym.spaces.Box(-1.0, 1.0, (1,))  # env.actions: unit, sac's default
    policy: Any = alg.policy_cls(observation_space=gym.spaces.Box(-8.0, 8.0, (3,)), action_space=box, model=trial.model,
                                 hyperparams=alg.hyperparams(trial.hyperparams, None), seed=0)  # fmt: skip
    opts = policy._nets().optimizers()
    assert opts["actor"].defaults["lr"] == pytest.approx(drawn["actor_lr"])
    assert opts["critic"].defaults["lr"] == pytest.approx(drawn["critic_lr"])
    assert policy.tau == pytest.approx(drawn["tau"])
