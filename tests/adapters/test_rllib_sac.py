"""RLlib's SAC through the adapter: the same networks as crossrl's core, uniform warm-up, a tiny real Pendulum run,
its checkpoint (replay buffer and temperature included), the mean action reloaded without Ray; in make test-system,
a resume from that checkpoint."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest

from crossrl.adapters import checkpoints
from crossrl.adapters.base import ListSink
from crossrl.adapters.rllib import adapter as R
from crossrl.core import algorithms
from crossrl.core.envs import make_env
from crossrl.core.sac_policy import SACPolicy
from crossrl.scenarios import metrics as M
from crossrl.scenarios.spec import ScenarioSpec, Trial

# RLlib runs in this process join one kept Ray (tests/conftest.py) instead of starting their own
pytestmark = pytest.mark.usefixtures("ray_cluster")

TINY = {"train_batch": 32, "learning_starts": 300, "updates_per_step": 0.25, "buffer_size": 5000}


def make_trial(
    *, env_steps: int = 2000, hidden: tuple[int, ...] = (16, 16), replay_buffer: bool = True, **hp: Any
) -> Trial:
    spec = ScenarioSpec.model_validate(
        {
            "name": "rllib-sac-test",
            "env": {"id": "Pendulum-v1"},
            "algorithm": {"name": "sac", "hyperparams": {**TINY, **hp}, "model": {"hidden": list(hidden)}},
            "engines": ["rllib"],
            "execution": {"workers": [1], "envs_per_worker": 1},
            "budget": {"env_steps": env_steps},
            "checkpoint": {"every_env_steps": 1000, "replay_buffer": replay_buffer},
            "seeds": [2],
        }
    )
    (trial,) = spec.trials()
    return trial


def test_the_rl_module_has_crossrls_actor_and_critics() -> None:
    """Actor obs->hidden->2|A|, each critic [obs, action]->hidden->1: as crossrl's SACPolicy."""
    trial = make_trial(hidden=(32, 16))
    from engine_models import rllib_config, rllib_module

    config = rllib_config(trial)
    module = rllib_module(trial, config)
    env = make_env(trial.env)
    alg = algorithms.load("sac")
    core = SACPolicy(
        observation_space=env.observation_space,
        action_space=env.action_space,
        hyperparams=alg.hyperparams(trial.hyperparams),
        model=trial.model,
        seed=0,
    )
    nets = core._nets()
    actor = sum(p.numel() for p in nets.actor.parameters())
    critic = sum(p.numel() for p in nets.critics[0].parameters())
    count = {name: sum(p.numel() for p in m.parameters()) for name, m in module.named_children()}
    assert count["pi_encoder"] + count["pi"] == actor == (3 * 32 + 32) + (32 * 16 + 16) + (16 * 2 + 2)
    assert count["qf_encoder"] + count["qf"] == count["qf_twin_encoder"] + count["qf_twin"] == critic
    assert sum(count.values()) == actor + 2 * critic  # nothing else (the learner adds the target copies)
    assert env.action_space == gym.spaces.Box(-1.0, 1.0, (1,), np.float32)  # env.actions 'unit'
    settings = config.to_dict()
    assert settings["replay_buffer_config"]["type"] == "EpisodeReplayBuffer"
    assert settings["twin_q"] and settings["target_network_update_freq"] == 0 and settings["grad_clip"] is None
    # one update per env step is 32 replayed rows per env step; RLlib's ratio counts a local runner that idles
    assert config.training_intensity == pytest.approx(0.25 * 32 * 1 / 2)


def newest(root: Path) -> tuple[Path, int]:
    """The newest checkpoint under ``root`` and its env step."""
    folder = checkpoints.checkpoints(root)[0]
    return folder, int(checkpoints.read_meta(folder)["env_steps_sampled"])


def last_alpha(alphas: list[float]) -> Any:
    def capture(_i: int, algo: Any) -> None:
        from crossrl.adapters.rllib.sac import log_alpha

        alphas.append(float(np.exp(log_alpha(algo)["default_policy"])))

    return capture


class Ran:
    def __init__(self, trial: Trial, sink: ListSink, alphas: list[float], root: Path) -> None:
        self.trial, self.sink, self.alphas, self.root = trial, sink, alphas, root


@pytest.fixture(scope="module")
def ran(ray_cluster: None, tmp_path_factory: pytest.TempPathFactory) -> Ran:
    """One real run (2,000 env steps, a checkpoint every 1,000), the temperature captured after each iteration."""
    root = tmp_path_factory.mktemp("rllib-sac") / "ck"
    trial = make_trial().model_copy(update={"checkpoint_dir": str(root)})
    sink = ListSink(trial)
    alphas: list[float] = []
    R.RllibAdapter(on_iteration=last_alpha(alphas)).run(trial, sink)
    return Ran(trial, sink, alphas, root)


@pytest.mark.long
def test_a_tiny_pendulum_run_trains_checkpoints_and_reloads(ran: Ran) -> None:
    """The run checked throughout: the updates per env step, the losses, the checkpoint's replay buffer and
    temperature, the mean action reloaded without Ray."""
    trial, alphas = ran.trial, ran.alphas

    # -- the run
    points = ran.sink.points
    assert len(points) >= 2 and points[-1][M.ENV_STEPS_SAMPLED] >= 2000
    returns = [p[M.EPISODE_RETURN_MEAN] for p in points if M.EPISODE_RETURN_MEAN in p]
    assert returns and all(-2000 < r <= 0 for r in returns)
    last = points[-1]
    for key in (M.VALUE_LOSS, M.POLICY_LOSS, M.ENTROPY, M.DIAG_ALPHA, M.DIAG_Q_MEAN, M.DIAG_ALPHA_LOSS):
        assert key in last and np.isfinite(last[key]), key
    # RLlib logs the temperature its updates used (smoothed over the iteration), not the learner's after the last one
    assert last[M.DIAG_ALPHA] == pytest.approx(alphas[-1], rel=0.25) and last[M.DIAG_ALPHA] < 1.0
    # 0.25 updates per env step after learning_starts (RLlib rounds to whole rounds: one update per 4 env steps)
    updates = last[M.DIAG_UPDATES]
    assert updates == pytest.approx(0.25 * (last[M.ENV_STEPS_SAMPLED] - 300), rel=0.1)
    assert last[M.ENV_STEPS_TRAINED] == 32 * updates

    # -- the checkpoint keeps the replay buffer and the temperature
    folder, _ = newest(ran.root)
    engine = folder / checkpoints.ENGINE_DIR
    assert (engine / R.REPLAY_FILE).is_file() and (engine / R.ALPHA_FILE).is_file()
    saved_alpha = float(np.exp(json.loads((engine / R.ALPHA_FILE).read_text())["default_policy"]))
    assert saved_alpha == pytest.approx(alphas[-1], rel=1e-5)  # the final checkpoint: the trial's last alpha

    # -- the mean action, reloaded without Ray
    act = R.load_policy(trial, folder)
    obs = np.array([1.0, 0.0, 0.0], np.float32)
    greedy = np.asarray(act(obs))
    assert greedy.shape == (1,) and np.all(np.abs(greedy) <= 1.0)
    assert np.array_equal(np.asarray(act(obs)), greedy)  # deterministic
    sample = R.load_policy(trial, folder, greedy=False)
    draws = np.array([sample(obs) for _ in range(30)])
    assert draws.std() > 0 and np.all(np.abs(draws) <= 1.0)
    # the mean action is tanh of the actor's mean: inside the spread of the samples, not clipped at a bound
    assert abs(float(greedy[0])) < 1.0


@pytest.mark.system  # a second RLlib run; SAC's kill and resume on every engine is in make test-system too
def test_a_resume_goes_on_from_the_checkpoints_buffer_and_temperature(ran: Ran, tmp_path: Path) -> None:
    folder, step = newest(ran.root)
    engine = folder / checkpoints.ENGINE_DIR
    saved_alpha = float(np.exp(json.loads((engine / R.ALPHA_FILE).read_text())["default_policy"]))
    resumed_trial = make_trial(env_steps=step + 1000).model_copy(
        update={"checkpoint_dir": str(tmp_path / "ck2"), "resume_from": str(folder)}
    )
    sink = ListSink(resumed_trial)
    seen: list[float] = []

    def first_alpha(i: int, algo: Any) -> None:
        from crossrl.adapters.rllib.sac import log_alpha

        if i == 0:
            seen.append(float(np.exp(log_alpha(algo)["default_policy"])))

    R.RllibAdapter(on_iteration=first_alpha).run(resumed_trial, sink)
    points = sink.points
    assert step < points[0][M.ENV_STEPS_SAMPLED] <= step + 1100  # the count goes on from the checkpoint
    # the temperature went on down from the saved one: 250 Adam steps of alpha_lr 1e-3 move log alpha by 0.25 at most,
    # so one restarted at 1.0 would still be above exp(-0.25) = 0.78 > the saved value
    assert saved_alpha < 0.75 and seen and seen[0] < saved_alpha
    assert points[0][M.DIAG_REPLAY_SIZE] >= step  # the buffer came back


@pytest.mark.system  # two more RLlib runs
def test_a_checkpoint_without_the_buffer_refills_it_before_training(ray_cluster: None, tmp_path: Path) -> None:
    """checkpoint.replay_buffer: false: no replay file in the checkpoints; a resumed trial's buffer starts empty and
    no update is made until it holds learning_starts (1,500) env steps again: 0.25 updates per env step after that.
    The refill spans a whole iteration (a point per 1,000 env steps) without updates, whose NaN learner stats are
    not a divergence."""
    trial = make_trial(env_steps=2000, replay_buffer=False, learning_starts=1500).model_copy(
        update={"checkpoint_dir": str(tmp_path / "ck")}
    )
    R.RllibAdapter().run(trial, ListSink(trial))
    folder, step = newest(tmp_path / "ck")
    engine = folder / checkpoints.ENGINE_DIR
    assert not (engine / R.REPLAY_FILE).exists() and (engine / R.ALPHA_FILE).is_file()
    saved = checkpoints.read_meta(folder)["engine_state"]
    assert "replay_buffer" not in saved
    resumed = make_trial(env_steps=step + 2000, replay_buffer=False, learning_starts=1500).model_copy(
        update={"checkpoint_dir": str(tmp_path / "ck2"), "resume_from": str(folder)}
    )
    sink = ListSink(resumed)
    R.RllibAdapter().run(resumed, sink)
    last = sink.points[-1]
    sampled = last[M.ENV_STEPS_SAMPLED] - step
    # the buffer started empty (RLlib's replay size is a mean over the iteration: kept, it would be >= step)
    assert last[M.DIAG_REPLAY_SIZE] < step
    trained = checkpoints.read_meta(folder)["env_steps_trained"]
    assert (last[M.ENV_STEPS_TRAINED] - trained) / 32 == pytest.approx(0.25 * (sampled - 1500), rel=0.1)
