"""PPO (Schulman et al. 2017): clipped surrogate objective on GAE advantages; sync_samples by default.

Hyperparameters (shared names): ``clip`` (ratio clip), ``vf_clip`` (value clip: the value prediction
may move at most this far from the sampling-time prediction, PPO2 style), ``vf_coeff``,
``entropy_coeff``, ``epochs`` x ``minibatch`` SGD over each ``train_batch``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from crossrl.core import sample_batch as sb
from crossrl.core.actor_critic import ActorCriticPolicy
from crossrl.core.algorithms import AlgorithmDef
from crossrl.scenarios import metrics as M

if TYPE_CHECKING:
    import torch


def value_loss(
    values: torch.Tensor, targets: torch.Tensor, old_values: torch.Tensor, vf_clip: float | None
) -> torch.Tensor:
    """0.5 x squared error, pessimistic over the clipped prediction when ``vf_clip`` is set."""
    import torch

    err = (values - targets) ** 2
    if vf_clip:
        clipped = old_values + (values - old_values).clamp(-vf_clip, vf_clip)
        err = torch.max(err, (clipped - targets) ** 2)
    return 0.5 * err.mean()


class PPOPolicy(ActorCriticPolicy):
    def loss(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, float]]:
        import torch  # here, not at module level: sampling-only evaluator actors never import torch

        logp, entropy, values = self.evaluate(batch[sb.OBS], batch[sb.ACTIONS])
        adv = batch[sb.ADVANTAGES]
        if self.hp["normalize_advantages"] and adv.numel() > 1:
            adv = (adv - adv.mean()) / (adv.std() + 1e-8)
        log_ratio = logp - batch[sb.LOGP]
        ratio = log_ratio.exp()
        clip = float(self.hp["clip"])
        pg_loss = -torch.min(ratio * adv, ratio.clamp(1.0 - clip, 1.0 + clip) * adv).mean()
        vf_loss = value_loss(values, batch[sb.VALUE_TARGETS], batch[sb.VF_PREDS], self.hp["vf_clip"])
        ent = entropy.mean()
        total = pg_loss + float(self.hp["vf_coeff"]) * vf_loss - float(self.hp["entropy_coeff"]) * ent
        with torch.no_grad():
            approx_kl = ((ratio - 1.0) - log_ratio).mean()  # k3 estimator, >= 0
            clip_frac = ((ratio - 1.0).abs() > clip).float().mean()
        return total, {
            M.POLICY_LOSS: pg_loss.item(),
            M.VALUE_LOSS: vf_loss.item(),
            M.ENTROPY: ent.item(),
            M.DIAG_APPROX_KL: float(approx_kl),
            M.DIAG_CLIP_FRAC: float(clip_frac),
        }


ALGORITHM = AlgorithmDef(name="ppo", policy_cls=PPOPolicy)
