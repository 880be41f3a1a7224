"""A2C (Mnih et al. 2016, synchronous): policy gradient on GAE advantages, one SGD step per batch.

``gae_lambda = 1`` (the catalog default) gives plain n-step returns bootstrapped at the fragment's end.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from crossrl.core import sample_batch as sb
from crossrl.core.actor_critic import ActorCriticPolicy
from crossrl.core.algorithms import AlgorithmDef
from crossrl.scenarios import metrics as M

if TYPE_CHECKING:
    import torch


class A2CPolicy(ActorCriticPolicy):
    def loss(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, float]]:
        logp, entropy, values = self.evaluate(batch[sb.OBS], batch[sb.ACTIONS])
        adv = batch[sb.ADVANTAGES]
        if self.hp["normalize_advantages"] and adv.numel() > 1:
            adv = (adv - adv.mean()) / (adv.std() + 1e-8)
        pg_loss = -(logp * adv).mean()
        vf_loss = 0.5 * ((values - batch[sb.VALUE_TARGETS]) ** 2).mean()
        ent = entropy.mean()
        total = pg_loss + float(self.hp["vf_coeff"]) * vf_loss - float(self.hp["entropy_coeff"]) * ent
        return total, {M.POLICY_LOSS: pg_loss.item(), M.VALUE_LOSS: vf_loss.item(), M.ENTROPY: ent.item()}


ALGORITHM = AlgorithmDef(name="a2c", policy_cls=A2CPolicy)
