"""RLlib's DreamerV3 through the adapter: the shared names reach DreamerV3Config, the fragment that makes RLlib's
training ratio the spec's, the refusals (evaluate / export), a tiny real CartPole run that checkpoints its replay
buffer, and a trial resumed from one of its checkpoints."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from crossrl.adapters.base import ListSink
from crossrl.adapters.rllib import adapter as R
from crossrl.scenarios import metrics as M
from crossrl.scenarios.spec import ScenarioSpec, Trial

# RLlib runs in this process join one kept Ray (tests/conftest.py) instead of starting their own
pytestmark = pytest.mark.usefixtures("ray_cluster")

# The smallest DreamerV3 RLlib builds: 4 sequences of 16 steps per update, one update per 16 env steps.
TINY = {"model_size": "nano", "batch_size_B": 4, "batch_length_T": 16, "training_ratio": 4.0, "horizon_H": 5}


def make_trial(
    *, env_steps: int = 300, engines: tuple[str, ...] = ("rllib",), checkpoint: dict[str, Any] | None = None, **hp: Any
) -> list[Trial]:
    spec = ScenarioSpec.model_validate(
        {
            **({"checkpoint": checkpoint} if checkpoint else {}),
            "name": "rllib-dreamer-test",
            "env": {"id": "CartPole-v1"},
            "algorithm": {"name": "dreamer", "hyperparams": {**TINY, **hp}},
            "engines": list(engines),
            "execution": {"workers": [1], "envs_per_worker": 1},
            "budget": {"env_steps": env_steps},
            # a point per 100 env steps, not the adapter's 1000, so that a 300-step run reports several
            "native": {"rllib": {"reporting": {"min_sample_timesteps_per_iteration": 100}}},
            "seeds": [4],
        }
    )
    return spec.trials()


def test_the_config_carries_every_shared_name() -> None:
    (trial,) = make_trial(gamma=0.99, gae_lambda=0.9, world_model_lr=2e-4, actor_lr=4e-5, critic_lr=5e-5)
    config = R.build_config(trial, plan=R.plan_resources(algorithm="dreamer", workers=1, available_cpus=2),
                            env_name="unused")  # fmt: skip
    assert type(config).__name__ == "DreamerV3Config"
    for name, path in R.HYPERPARAM_MAP["dreamer"].items():
        assert R._resolve(config, path) == trial.hp(name), name
    assert config.replay_buffer_config["type"] == "EpisodeReplayBuffer"
    # 4 x 16 replayed per update / ratio 4 = 16 env steps per sample call: one update per 16 env steps
    assert config.rollout_fragment_length == 16 and config.min_sample_timesteps_per_iteration == 100
    assert not config.use_curiosity and config.train_actor and config.train_critic


def test_the_fragment_sets_rllibs_ratio() -> None:
    hp = {"batch_size_B": 16, "batch_length_T": 64, "training_ratio": 1024.0}
    assert R.dreamer_fragment(hp, envs_per_worker=1) == 1  # the paper's ratio: one update per env step
    assert R.dreamer_fragment({**hp, "training_ratio": 64.0}, envs_per_worker=4) == 4  # 16 env steps per call
    assert R.dreamer_fragment({**hp, "training_ratio": 4096.0}, envs_per_worker=1) == 1  # at least one


def test_free_bits_rllib_hard_codes_are_refused_when_changed() -> None:
    (trial,) = make_trial(free_bits=0.5)
    with pytest.raises(ValueError, match=r"free_bits=0.5 cannot be set.*1 nat"):
        R.check_covered(trial)


def test_evaluate_and_export_refuse_dreamer(tmp_path: Path) -> None:
    (trial,) = make_trial()
    with pytest.raises(ValueError, match="recurrent state"):
        R.load_policy(trial, tmp_path)
    with pytest.raises(ValueError, match="recurrent state"):
        R.export_policy(trial, tmp_path)


@pytest.mark.long
def test_a_tiny_cartpole_run_checkpoints_its_replay_and_a_resumed_trial_counts_on(tmp_path: Path) -> None:
    """A tiny trial reports points and checkpoints DreamerV3's replay buffer (``algo.replay_buffer``) beside RLlib's
    files; a fresh algorithm restored from the first checkpoint holds that replay, the learner's three learning rates
    and the checkpoint's counters; a trial resumed from it goes on from there to the budget."""
    from ray.tune.registry import register_env

    from crossrl.adapters import checkpoints
    from crossrl.core.cluster import free_cpus

    (trial,) = make_trial(env_steps=400, checkpoint={"every_env_steps": 200})
    trial = trial.model_copy(update={"checkpoint_dir": str(tmp_path / "ck")})
    sink = ListSink(trial)
    t0 = time.perf_counter()
    R.RllibAdapter().run(trial, sink)
    took = time.perf_counter() - t0
    points = [m for m in sink.messages if m["kind"] == "point"]
    assert points and sink.exhausted, sink.messages[-3:]
    assert points[-1]["step"] >= 400
    last = sink.points[-1]
    for name in (M.POLICY_LOSS, M.VALUE_LOSS, M.DIAG_WORLD_MODEL_LOSS, M.DIAG_UPDATES):
        assert name in last, sorted(last)
    assert last[M.DIAG_UPDATES] >= 400 / 16 - 1  # one update per 16 env steps after the 64-step warm-up
    assert any(sink.points[i].get(M.EPISODE_RETURN_MEAN) for i in range(len(points)))
    print(f"tiny dreamer run: {took:.1f} s, {len(points)} points, {last[M.DIAG_UPDATES]:.0f} updates")

    first = checkpoints.checkpoints(tmp_path / "ck")[-1]  # newest first
    meta = checkpoints.read_meta(first)
    step, state = int(meta["env_steps_sampled"]), meta["engine_state"]
    assert 200 <= step < 400 and state["replay_buffer"] == R.REPLAY_FILE
    assert 64 <= state["replay_env_steps"] <= step  # DreamerV3's episodes, not the unused local_replay_buffer's 0

    name = "crossrl-dreamer-ckpt-test"
    register_env(name, R.env_creator)
    plan = R.plan_resources(algorithm="dreamer", workers=1, available_cpus=free_cpus())
    algo = R.build_config(trial, plan=plan, env_name=name).build_algo()
    try:
        assert algo.replay_buffer.get_num_timesteps() == 0
        lrs = R.trial_learning_rates(trial)
        assert lrs == {"world_model": trial.hp("world_model_lr"), "actor": trial.hp("actor_lr"),
                       "critic": trial.hp("critic_lr")}  # fmt: skip
        done = R.restore(algo, first / checkpoints.ENGINE_DIR, lr=lrs, algorithm="dreamer")
        assert done["replay_env_steps"] == state["replay_env_steps"] == algo.replay_buffer.get_num_timesteps()
        assert done["lr"] == sorted(set(lrs.values()))
        assert R.engine_counters(algo, algorithm="dreamer")[0] == step
    finally:
        algo.stop()

    resumed = trial.model_copy(update={"checkpoint_dir": str(tmp_path / "ck2"), "resume_from": str(first)})
    sink = ListSink(resumed)
    R.RllibAdapter().run(resumed, sink)
    (setup,) = [m for m in sink.messages if m["kind"] == "setup"]
    assert setup["resumed_env_step"] == step
    steps = [int(p[M.ENV_STEPS_SAMPLED]) for p in sink.points]
    assert steps[0] > step and steps[-1] >= 400 and sink.exhausted  # on from the checkpoint's, never from 0
    # no second warm-up of B x T random steps, and the updates go on from the checkpoint's count at the ratio
    assert steps[-1] <= 400 + 100 + 16
    assert sink.points[-1][M.DIAG_UPDATES] >= last[M.DIAG_UPDATES] - 2


def test_rllibs_actor_divides_advantages_by_the_return_range_without_the_papers_floor_of_one() -> None:
    """RLlib 2.60's DreamerV3 scales the actor's advantages by the moving 5-95 percentile range of the imagined returns
    clamped at 1e-8 (``_compute_scaled_value_targets``), where the paper (eq. 12), crossrl's core and TorchRL's
    ``DreamerV3ActorLoss`` divide by ``max(1, S)``: while returns are small (a fresh reward head), RLlib multiplies
    the advantages' noise by up to 1/S. docs/learning.md and docs/fairness.md rest on this; should RLlib change it,
    this test says so."""
    from types import SimpleNamespace

    import torch
    from ray.rllib.algorithms.dreamerv3.torch.dreamerv3_torch_learner import DreamerV3TorchLearner

    actor = SimpleNamespace(ema_value_target_pct5=torch.tensor(float("nan")),
                            ema_value_target_pct95=torch.tensor(float("nan")))  # fmt: skip
    module = SimpleNamespace(unwrapped=lambda: SimpleNamespace(actor=actor))
    learner = SimpleNamespace(module={"default_policy": module})
    targets = torch.linspace(0.0, 0.02, 101).reshape(101, 1)  # returns spread over 0.02: S = 0.018
    advantages = DreamerV3TorchLearner._compute_scaled_value_targets(
        learner,  # type: ignore[arg-type]
        module_id="default_policy",
        config=SimpleNamespace(return_normalization_decay=0.99),
        value_targets_t0_to_Hm1_BxT=targets,
        value_predictions_t0_to_Hm1_BxT=torch.zeros_like(targets),
    )
    spread = float(actor.ema_value_target_pct95 - actor.ema_value_target_pct5)
    assert spread == pytest.approx(0.018, rel=1e-3)
    # divided by S itself (0.018), not by max(1, S) = 1: the advantages are targets / S, some 55x the paper's
    assert torch.allclose(advantages, targets / spread, atol=1e-5)
    assert float(advantages.max()) > 50 * float(targets.max())


def test_rllibs_imagination_ends_a_dreamed_episode_only_where_the_continue_head_is_sure() -> None:
    """RLlib 2.60's continue predictor gives imagination its mode (``p > 0.5``, as the authors' code does), where
    crossrl's core and TorchRL's ``DreamerV3ActorLoss`` weigh each dreamed step by the probability: a dreamed step the
    continue head gives a 40 % chance of ending is read as "continues" by RLlib. docs/fairness.md and docs/learning.md
    rest on this."""
    import torch
    from ray.rllib.algorithms.dreamerv3.torch.models.components.continue_predictor import ContinuePredictor

    head = ContinuePredictor(input_size=8 + 4 * 4, model_size="nano")
    last = [m for m in head.modules() if isinstance(m, torch.nn.Linear)][-1]
    with torch.no_grad():
        for p in head.parameters():
            p.zero_()
        last.bias.fill_(float(torch.logit(torch.tensor(0.6))))  # P(continue) = 0.6 everywhere
    h, z = torch.zeros(3, 8), torch.zeros(3, 4, 4)
    imagined, bernoulli = head(h=h, z=z, return_distribution=True)
    assert torch.allclose(bernoulli.probs, torch.full((3,), 0.6))
    assert imagined.dtype == torch.bool and bool(imagined.all())  # 0.6 read as 1, not weighed as 0.6


def test_rllibs_dreamer_stats_come_under_the_names_the_other_engines_use() -> None:
    """The world model's terms and the returns' scale, as crossrl's core and TorchRL's adapter report them, so the
    three engines' DreamerV3 diagnostics sit side by side in the MLflow UI; a missing stat is left out, not zero."""
    stats = {"ACTOR_L_total": 0.5, "CRITIC_L_total": 9.1, "ACTOR_action_entropy": 0.6, "WORLD_MODEL_L_total": 2.4,
             "WORLD_MODEL_L_decoder": 0.14, "WORLD_MODEL_L_reward": 1.5, "WORLD_MODEL_L_continue": 0.16,
             "ACTOR_value_targets_pct95_ema": 2.7, "ACTOR_value_targets_pct5_ema": 0.27}  # fmt: skip
    values = R.dreamer_values(stats, updates=626)
    assert values[M.DIAG_REWARD_LOSS] == 1.5 and values[M.DIAG_DECODER_LOSS] == 0.14
    assert values[M.DIAG_CONTINUE_LOSS] == 0.16 and values[M.DIAG_WORLD_MODEL_LOSS] == 2.4
    assert values[M.DIAG_RETURN_SCALE] == pytest.approx(2.43)
    assert values[M.ENTROPY] == 0.6 and values[M.DIAG_UPDATES] == 626
    early = R.dreamer_values({"ACTOR_value_targets_pct95_ema": float("nan")}, updates=None)
    assert early[M.DIAG_RETURN_SCALE] is None and early[M.DIAG_REWARD_LOSS] is None
