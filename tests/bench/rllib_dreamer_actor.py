"""RLlib 2.60's own DreamerV3 on CartPole-v1, without any of crossrl's code, with its learner's stats printed per
point: return, the reward head's loss, the actor's entropy and the imagined returns' 5th and 95th percentiles (the
moving averages the actor's advantages are scaled by). docs/learning.md ("Why RLlib's rows stay at random play") is
measured with it.

    .venv/bin/python tests/bench/rllib_dreamer_actor.py [--env-steps 6000] [--seed 0] [--runners 0] [--paper-scale]
        [--soft-continue]

The settings are cartpole-dreamer's as the adapter passes them (``model_size="mini"``, ``training_ratio=256``, B x T 16
x 64, ``rollout_fragment_length=4``: one update per 4 env steps). ``--paper-scale`` replaces RLlib's scaling of the
advantages, ``(R - v) / clamp(S, min=1e-8)``, by the paper's ``(R - v) / max(1, S)`` (eq. 12), the rest of RLlib's
learner unchanged. ``--soft-continue`` makes RLlib's imagination weigh each dreamed step by the continue head's
probability, as crossrl's core does, where RLlib (as the authors' code) takes the head's mode (``p > 0.5``): a
dreamed episode then ends only where the world model is sure of it. ``actor_sync_gap`` is the largest difference
between the actor weights the (local) env runner acts with and the learner's. One JSON line per point of at least 500
env steps. Learning runs in this process, on one core.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from typing import Any


def paper_scale() -> None:
    """Patch RLlib's DreamerV3 learner to divide the advantages by max(1, S), S the moving 5-95 % range."""
    import torch
    from ray.rllib.algorithms.dreamerv3.torch.dreamerv3_torch_learner import DreamerV3TorchLearner

    def scaled(
        self: Any,
        *,
        module_id: str,
        config: Any,
        value_targets_t0_to_Hm1_BxT: Any,
        value_predictions_t0_to_Hm1_BxT: Any,
    ) -> Any:
        actor = self.module[module_id].unwrapped().actor
        targets = value_targets_t0_to_Hm1_BxT
        decay = config.return_normalization_decay
        for name, q in (("ema_value_target_pct5", 0.05), ("ema_value_target_pct95", 0.95)):
            old, new = getattr(actor, name), torch.quantile(targets, q)
            getattr(actor, name).data = torch.where(torch.isnan(old), new, decay * old + (1 - decay) * new)
        scale = torch.clamp(actor.ema_value_target_pct95 - actor.ema_value_target_pct5, min=1.0)
        return (targets - value_predictions_t0_to_Hm1_BxT) / scale

    DreamerV3TorchLearner._compute_scaled_value_targets = scaled  # type: ignore[method-assign]


def soft_continue() -> None:
    """Patch RLlib's continue predictor to return the continue probability where it returns ``p > 0.5``.

    Only imagination reads that first output (the world model's loss reads the Bernoulli it returns beside it).
    """
    import torch
    from ray.rllib.algorithms.dreamerv3.torch.models.components.continue_predictor import ContinuePredictor

    def forward(self: Any, h: Any, z: Any, return_distribution: bool = False) -> Any:
        logits = self.mlp(torch.cat([h, z.reshape(z.shape[0], -1)], dim=-1)).squeeze(dim=-1)
        bernoulli = torch.distributions.Bernoulli(logits=logits)
        return (bernoulli.probs, bernoulli) if return_distribution else bernoulli.probs

    ContinuePredictor.forward = forward  # type: ignore[method-assign]


def actor_sync_gap(algo: Any) -> float:
    """The largest difference between the actor weights the env runner acts with and the learner's (0: in sync).

    NaN with remote env runners (``--runners`` > 0): the local env runner then does not act."""
    if algo.env_runner is None or algo.env_runner.module is None:
        return float("nan")
    acting = algo.env_runner.module.state_dict()
    learned = algo.learner_group._learner.module["default_policy"].state_dict()
    return max(
        float((acting[k] - learned[k]).abs().max()) for k in acting if k.startswith("actor.mlp") and k in learned
    )


def open_loop(algo: Any, *, start: int = 4, steps: int = 8, windows: int = 256) -> dict[str, float]:
    """How well RLlib's world model predicts the real env's next observations from the actions taken, against the
    same actions flipped (CartPole's 2 actions: push left / right).

    Replayed windows through RLlib's own ``forward_train`` (posterior states), then from step ``start`` its prior
    rolled ``steps`` steps with the taken actions, and again with each action flipped, the decoded observations
    against the real ones (symlog space, mean squared error over the velocity dimensions the action moves: cart
    velocity and pole angular velocity). A world model that knows what an action does is further off with the
    flipped actions; one that ignores them is as far off either way.
    """
    import numpy as np
    import torch
    from ray.rllib.utils.torch_utils import symlog

    model = algo.learner_group._learner.module["default_policy"].unwrapped().dreamer_model.world_model
    batch = algo.replay_buffer.sample(batch_size_B=windows, batch_length_T=start + steps + 1)
    obs = torch.as_tensor(np.asarray(batch["obs"]), dtype=torch.float32)
    ints = torch.as_tensor(np.asarray(batch["actions"]), dtype=torch.int64)
    first = torch.as_tensor(np.asarray(batch["is_first"]), dtype=torch.float32)
    keep = first[:, 1:].sum(-1) == 0  # rows with no episode start after the window's first step
    model.batch_length_T = obs.shape[1]
    errors = {}
    with torch.no_grad():
        out = model.forward_train(obs, torch.nn.functional.one_hot(ints, 2).float(), first)
        h, z = (out[k].unflatten(0, obs.shape[:2])[:, start] for k in ("h_states_BxT", "z_posterior_states_BxT"))
        for name, acts in (("taken", ints), ("flipped", 1 - ints)):
            hk, zk, err = h, z, []
            for k in range(steps):
                a = torch.nn.functional.one_hot(acts[:, start + k], 2).float()
                hk = model.sequence_model(a=a, h=hk, z=zk)
                zk = model.dynamics_predictor(h=hk)
                predicted = model.decoder(h=hk, z=zk)
                real = symlog(obs[:, start + k + 1])
                err.append(((predicted - real)[:, [1, 3]] ** 2).mean(-1))
            errors[name] = float(torch.stack(err, 1)[keep].mean())
    return {"open_loop_mse_taken": errors["taken"], "open_loop_mse_flipped": errors["flipped"], "rows": int(keep.sum())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--env-steps", type=int, default=6000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--runners", type=int, default=0, help="remote env runners (0: RLlib's default for DreamerV3)")
    parser.add_argument("--paper-scale", action="store_true", help="advantages / max(1, S), the paper's eq. 12")
    parser.add_argument("--soft-continue", action="store_true", help="imagination weighs steps by P(continue)")
    parser.add_argument("--open-loop", action="store_true", help="at the end: the world model's open-loop errors")
    args = parser.parse_args()
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

    import ray
    import torch
    from ray.rllib.algorithms.dreamerv3 import DreamerV3Config

    torch.set_num_threads(1)
    if args.paper_scale:
        paper_scale()
    if args.soft_continue:
        soft_continue()
    ray.init(num_cpus=1 + args.runners, include_dashboard=False, log_to_driver=False,
             _temp_dir=tempfile.mkdtemp(prefix="ray-"))  # fmt: skip
    config = (
        DreamerV3Config()
        .environment("CartPole-v1")
        .env_runners(num_env_runners=args.runners, rollout_fragment_length=4, num_envs_per_env_runner=1)
        .training(model_size="mini", training_ratio=256, batch_size_B=16, batch_length_T=64)
        .reporting(min_sample_timesteps_per_iteration=500)
        .debugging(seed=args.seed)
    )
    algo = config.build_algo()
    start = time.monotonic()
    try:
        while True:
            result = algo.train()
            stats = result.get("learners", {}).get("default_policy", {})
            runners = result.get("env_runners", {})
            steps = int(runners.get("num_env_steps_sampled_lifetime", 0))
            row = {
                "seconds": round(time.monotonic() - start),
                "env_steps": steps,
                "return": runners.get("episode_return_mean"),
                "updates": result.get("num_grad_updates_lifetime"),
                "reward_loss": stats.get("WORLD_MODEL_L_reward"),
                "world_model_loss": stats.get("WORLD_MODEL_L_total"),
                "actor_entropy": stats.get("ACTOR_action_entropy"),
                "returns_pct5": stats.get("ACTOR_value_targets_pct5_ema"),
                "returns_pct95": stats.get("ACTOR_value_targets_pct95_ema"),
                "continue_loss": stats.get("WORLD_MODEL_L_continue"),
                "actor_grad_norm": stats.get("ACTOR_gradients_global_norm"),
                "actor_reinforce": stats.get("ACTOR_L_neglogp_reinforce_term"),
                "actor_sync_gap": actor_sync_gap(algo),
            }
            print(json.dumps({k: round(float(v), 4) if v is not None else None for k, v in row.items()}), flush=True)
            if steps >= args.env_steps:
                if args.open_loop:
                    print(json.dumps(open_loop(algo)), flush=True)
                break
    finally:
        algo.stop()
        ray.shutdown()


if __name__ == "__main__":
    main()
