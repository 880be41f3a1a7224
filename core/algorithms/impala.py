"""IMPALA (Espeholt et al. 2018): actor-critic on V-trace targets, so stale-weight samples stay usable.

The loss works on time-major ``[T, N]`` batches with the *learner's* current values; V-trace corrects
for the lag between the behaviour policy (LOGP recorded at sampling) and the learner's policy.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from crossrl.core import maths
from crossrl.core import sample_batch as sb
from crossrl.core.actor_critic import ActorCriticPolicy
from crossrl.core.algorithms import AlgorithmDef
from crossrl.scenarios import metrics as M

if TYPE_CHECKING:
    import torch


class VTracePolicy(ActorCriticPolicy):
    use_gae = False  # targets depend on the learner's policy: computed in the loss, not on the worker

    def loss(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, float]]:
        import torch  # here, not at module level: sampling-only evaluator actors never import torch

        logp, entropy, values = self.evaluate(batch[sb.OBS], batch[sb.ACTIONS])  # [T, N]
        with torch.no_grad():
            boot = self.net["vf"](self.net_input(batch[sb.NEXT_OBS][-1]))[:, 0]
            v = values.detach()
            # In NEXT_STEP autoreset the row after an ended episode holds its final obs (see next_values_from).
            next_values = torch.cat([v[1:], boot[None]], dim=0)
            vs, pg_adv = maths.vtrace(
                behaviour_logp=batch[sb.LOGP].numpy(),
                target_logp=logp.detach().numpy(),
                rewards=batch[sb.REWARDS].numpy(),
                values=v.numpy(),
                next_values=next_values.numpy(),
                terminated=batch[sb.TERMINATEDS].numpy(),
                truncated=batch[sb.TRUNCATEDS].numpy(),
                valid=batch[sb.VALID].numpy() if sb.VALID in batch else None,
                gamma=float(self.hp["gamma"]),
                clip_rho=float(self.hp["vtrace_clip_rho"]),
                clip_c=float(self.hp["vtrace_clip_c"]),
            )
        mask = batch[sb.VALID].float() if sb.VALID in batch else torch.ones_like(values)
        n = mask.sum().clamp_min(1.0)
        pg_loss = -(logp * torch.as_tensor(pg_adv, dtype=logp.dtype) * mask).sum() / n
        vf_loss = 0.5 * (((values - torch.as_tensor(vs, dtype=values.dtype)) ** 2) * mask).sum() / n
        ent = (entropy * mask).sum() / n
        total = pg_loss + float(self.hp["vf_coeff"]) * vf_loss - float(self.hp["entropy_coeff"]) * ent
        rho = np.exp(logp.detach().numpy() - batch[sb.LOGP].numpy())
        return total, {
            M.POLICY_LOSS: pg_loss.item(),
            M.VALUE_LOSS: vf_loss.item(),
            M.ENTROPY: ent.item(),
            M.DIAG_MEAN_RHO: float(rho[mask.numpy() > 0].mean()),
        }


ALGORITHM = AlgorithmDef(name="impala", policy_cls=VTracePolicy)
