"""RLlib 2.60's SAC (new API stack) made to run the network and the warm-up every engine runs.

- **The critics**: RLlib's default SAC Q network is a multi-stream encoder (an observation MLP and an action MLP,
  concatenated, then a fusion net with dense skips: 658,433 parameters per critic on Pendulum at [256, 256] against
  67,329), and no ``DefaultModelConfig`` setting gives the plain MLP on ``[observation, action]`` that crossrl's core,
  TorchRL and CleanRL use. :class:`ConcatQCatalog` builds that MLP (``fcnet_hiddens`` and ``fcnet_activation``, then
  RLlib's linear head): the same layers and parameter counts as the other engines'. The actor is RLlib's own (its
  encoder is the same MLP, its head a linear layer to a mean and a log std per action dimension).
- **The warm-up**: RLlib's SAC acts with its untrained policy until learning starts (a tanh of a wide Gaussian,
  U-shaped over the bounds); crossrl's core, TorchRL and CleanRL act uniformly at random. :class:`SACUniformWarmup`
  samples with RLlib's own ``random_actions=True`` (the env's ``action_space.sample()``) until
  ``num_steps_sampled_before_learning_starts`` env steps, then runs RLlib's training step unchanged; after a restore
  from a checkpoint without the replay buffer (``checkpoint.replay_buffer: false``) it samples with the policy and
  makes no update until the buffer holds that many env steps again (:meth:`SACUniformWarmup.refill`).
- **The temperature in checkpoints**: RLlib's ``save_to_path`` keeps neither the replay buffer (the adapter pickles
  it, as DQN's) nor SAC's ``log_alpha`` (a plain tensor of the learner, outside the RLModule and the optimizers'
  states: a restored trial would start again at alpha = 1). :func:`log_alpha` and :func:`set_log_alpha` carry it.
- **The mean action**: RLlib's ``TorchSquashedGaussian.to_deterministic()`` is the unsquashed mean; the squashed
  Gaussian's deterministic action is ``tanh(mean)`` (:func:`mean_action`).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from ray.rllib.algorithms.sac import SAC
from ray.rllib.algorithms.sac.sac_catalog import SACCatalog
from ray.rllib.core.columns import Columns
from ray.rllib.core.models.base import ENCODER_OUT, Encoder
from ray.rllib.core.models.configs import MLPEncoderConfig
from ray.rllib.core.models.torch.base import TorchModel
from ray.rllib.execution.rollout_ops import synchronous_parallel_sample
from ray.rllib.utils.metrics import (
    ENV_RUNNER_RESULTS,
    ENV_RUNNER_SAMPLING_TIMER,
    NUM_ENV_STEPS_SAMPLED_LIFETIME,
    REPLAY_BUFFER_ADD_DATA_TIMER,
    TIMERS,
)

# RLlib's SAC learner keeps one optimizer per network -> the shared hyperparameter of its learning rate
OPTIMIZER_LR: dict[str, str] = {"policy": "actor_lr", "qf": "critic_lr", "qf_twin": "critic_lr", "alpha": "alpha_lr"}


class TorchConcatMLPEncoder(TorchModel, Encoder):  # type: ignore[misc]
    """``ENCODER_OUT = MLP(concat(observation, action))``: an MLPEncoderConfig whose input is both."""

    def __init__(self, config: MLPEncoderConfig) -> None:
        TorchModel.__init__(self, config)
        Encoder.__init__(self, config)
        self.mlp = config.build(framework="torch")

    def _forward(self, input_dict: dict[Any, Any], **kwargs: Any) -> dict[Any, Any]:
        x = torch.cat([input_dict[Columns.OBS].float(), input_dict[Columns.ACTIONS].float()], dim=-1)
        out: dict[str, Any] = self.mlp({Columns.OBS: x})
        assert ENCODER_OUT in out
        return out


class ConcatQCatalog(SACCatalog):  # type: ignore[misc]
    """SAC's catalog with each critic a plain MLP on ``[observation, action]`` (``fcnet_hiddens`` with
    ``fcnet_activation``), for Box actions; the policy network is RLlib's default."""

    def _build_qf_encoder_continuous(self, framework: str) -> Encoder:
        obs_dim = int(np.prod(self.observation_space.shape or ()))
        act_dim = int(np.prod(self.action_space.shape or ()))
        hiddens = list(self._model_config_dict["fcnet_hiddens"])
        activation = self._model_config_dict["fcnet_activation"]
        config = MLPEncoderConfig(
            input_dims=[obs_dim + act_dim],
            hidden_layer_dims=hiddens[:-1],
            hidden_layer_activation=activation,
            output_layer_dim=hiddens[-1],
            output_layer_activation=activation,
        )
        return TorchConcatMLPEncoder(config)


class SACUniformWarmup(SAC):  # type: ignore[misc]
    """RLlib's SAC whose env runners act uniformly at random (``random_actions=True``: the env's
    ``action_space.sample()``) until ``num_steps_sampled_before_learning_starts`` env steps were sampled; then RLlib's
    own ``training_step``. Set as ``config.algo_class`` before ``build_algo()``.

    At the switch every env runner starts its episodes afresh: a randomly acted chunk carries none of the policy's
    extra outputs (its log-probabilities), and RLlib's replay buffer refuses to join it to a later chunk of the same
    episode that does. The episodes in flight at the switch end there as cut (truncated) ones, as at a checkpoint."""

    _warming = True
    _refill = 0  # after a restore without the replay buffer: no update until it holds this many env steps again

    def refill(self) -> int:
        """After a restore from a checkpoint without the replay buffer (``checkpoint.replay_buffer: false``): the
        env runners act with the restored policy and no update is made until the buffer holds
        ``num_steps_sampled_before_learning_starts`` env steps again (or its capacity). Returns that count."""
        algo: Any = self
        self._refill = min(
            int(algo.config.num_steps_sampled_before_learning_starts),
            int(algo.config.replay_buffer_config["capacity"]),
        )
        return self._refill

    def training_step(self) -> Any:
        algo: Any = self  # RLlib types its attributes Optional; here they are all set
        sampled = algo.metrics.peek((ENV_RUNNER_RESULTS, NUM_ENV_STEPS_SAMPLED_LIFETIME), default=0)
        if sampled >= algo.config.num_steps_sampled_before_learning_starts:
            if self._warming:
                algo.env_runner_group.foreach_env_runner(_start_afresh, local_env_runner=True)
                self._warming = False
            if algo.local_replay_buffer.get_num_timesteps() >= self._refill:
                return super().training_step()
            return self._sample_into_buffer(random_actions=False)
        return self._sample_into_buffer(random_actions=True)

    def _sample_into_buffer(self, *, random_actions: bool) -> None:
        """One round of sampling into the replay buffer, no update: uniformly random actions (the warm-up) or the
        policy's (a refill)."""
        algo: Any = self
        with algo.metrics.log_time((TIMERS, ENV_RUNNER_SAMPLING_TIMER)):
            sampled_out: Any = synchronous_parallel_sample(
                worker_set=algo.env_runner_group,
                concat=True,
                sample_timeout_s=algo.config.sample_timeout_s,
                random_actions=random_actions,
                _uses_new_env_runners=True,
                _return_metrics=True,
            )
        episodes, env_runner_results = sampled_out
        algo.metrics.aggregate(env_runner_results, key=ENV_RUNNER_RESULTS)
        with algo.metrics.log_time((TIMERS, REPLAY_BUFFER_ADD_DATA_TIMER)):
            algo.local_replay_buffer.add(episodes)
        return None


def _start_afresh(env_runner: Any) -> None:
    """The env runner resets its envs before its next sample (RLlib's own flag, set on creation)."""
    env_runner._needs_initial_reset = True


def _log_alpha(learner: Any) -> dict[str, float]:
    return {mid: float(t.detach().cpu().reshape(-1)[0]) for mid, t in learner.curr_log_alpha.items()}


def _set_log_alpha(learner: Any, *, values: dict[str, float]) -> dict[str, float]:
    with torch.no_grad():
        for mid, value in values.items():
            learner.curr_log_alpha[mid].data.fill_(value)  # in place: the alpha optimizer keeps the same tensor
    return _log_alpha(learner)


def log_alpha(algo: Any) -> dict[str, float]:
    """Module id -> the learner's ``log alpha`` now."""
    return dict(next(iter(algo.learner_group.foreach_learner(_log_alpha))).get())


def set_log_alpha(algo: Any, values: dict[str, float]) -> dict[str, float]:
    """Every learner's ``log alpha`` set in place to ``values`` (module id -> value); returns the values set."""
    return dict(next(iter(algo.learner_group.foreach_learner(_set_log_alpha, values=values))).get())


def mean_action(action_dist_inputs: torch.Tensor) -> torch.Tensor:
    """The squashed Gaussian's deterministic action ``tanh(mean)``, in [-1, 1], from RLlib's distribution inputs
    (the mean, then the log std, per action dimension)."""
    mean, _log_std = action_dist_inputs.chunk(2, dim=-1)
    return torch.tanh(mean)
