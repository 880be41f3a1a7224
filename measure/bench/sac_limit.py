"""The limit of a SAC learner on this machine: a plain torch SAC update loop, no framework.

The same networks as every engine's SAC (an actor MLP to a mean and a log std per action dimension, two critic MLPs
on ``[observation, action]``, target copies of the critics), the same batch and the same work per update (the critics
on the soft Bellman target, the actor through the critics, the temperature, a Polyak step), written as plainly as
CleanRL's ``sac_continuous_action.py``: torch modules and three Adam optimizers, nothing else. Its updates per
second are what a framework's SAC learner can reach at most here; ``crossrl bench sac`` quotes each engine's
against it, measured in the same run.
"""

from __future__ import annotations

import math
import time
from typing import Any


def plain_sac_updates_per_s(
    *, obs_dim: int, act_dim: int, hidden: tuple[int, ...], batch: int, seconds: float, warmup: int = 20, seed: int = 0
) -> dict[str, float]:
    """Updates per second of the plain loop over ``seconds`` (after ``warmup`` updates) on one torch thread, on a
    fixed random batch (replay sampling is not part of the learner), and the CPU seconds per update."""
    import torch
    from torch import nn

    torch.set_num_threads(1)
    torch.manual_seed(seed)

    def mlp(n_in: int, n_out: int) -> nn.Sequential:
        layers: list[nn.Module] = []
        for width in hidden:
            layers += [nn.Linear(n_in, width), nn.ReLU()]
            n_in = width
        return nn.Sequential(*layers, nn.Linear(n_in, n_out))

    actor = mlp(obs_dim, 2 * act_dim)
    critics = nn.ModuleList([mlp(obs_dim + act_dim, 1) for _ in range(2)])
    targets = nn.ModuleList([mlp(obs_dim + act_dim, 1) for _ in range(2)])
    targets.load_state_dict(critics.state_dict())
    log_alpha = torch.zeros((), requires_grad=True)
    actor_opt = torch.optim.Adam(actor.parameters(), lr=3e-4)
    critic_opt = torch.optim.Adam(critics.parameters(), lr=1e-3)
    alpha_opt = torch.optim.Adam([log_alpha], lr=1e-3)
    obs, next_obs = torch.randn(batch, obs_dim), torch.randn(batch, obs_dim)
    actions = torch.rand(batch, act_dim) * 2 - 1
    rewards, not_done = torch.randn(batch), torch.ones(batch)

    def sample(o: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        mean, log_std = actor(o).chunk(2, dim=-1)
        std = log_std.clamp(-20, 2).exp()
        pre = mean + std * torch.randn_like(mean)
        a = torch.tanh(pre)
        logp = (-0.5 * ((pre - mean) / std) ** 2 - std.log() - 0.5 * math.log(2 * math.pi)).sum(-1)
        return a, logp - torch.log(1 - a.pow(2) + 1e-6).sum(-1)

    def q(nets: nn.ModuleList, o: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
        x = torch.cat([o, a], dim=-1)
        return torch.min(nets[0](x), nets[1](x)).squeeze(-1)

    def update() -> None:
        alpha = log_alpha.exp().detach()
        with torch.no_grad():
            a2, logp2 = sample(next_obs)
            y = rewards + 0.99 * not_done * (q(targets, next_obs, a2) - alpha * logp2)
        x = torch.cat([obs, actions], dim=-1)
        critic_loss = sum(((net(x).squeeze(-1) - y) ** 2).mean() for net in critics)
        critic_opt.zero_grad()
        critic_loss.backward()  # type: ignore[union-attr]
        critic_opt.step()
        a, logp = sample(obs)
        actor_loss = (alpha * logp - q(critics, obs, a)).mean()
        actor_opt.zero_grad()
        actor_loss.backward()
        actor_opt.step()
        alpha_loss = -(log_alpha * (logp.detach() - act_dim)).mean()
        alpha_opt.zero_grad()
        alpha_loss.backward()
        alpha_opt.step()
        with torch.no_grad():
            for t, p in zip(targets.parameters(), critics.parameters(), strict=True):
                t.lerp_(p, 0.005)

    for _ in range(warmup):
        update()
    n, t0, c0 = 0, time.perf_counter(), time.process_time()
    while time.perf_counter() - t0 < seconds:
        update()
        n += 1
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    return {"updates_per_s": n / wall, "cpu_s_per_update": cpu / n, "updates": float(n)}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """``python -m crossrl.measure.bench.sac_limit OBS ACT HIDDEN BATCH SECONDS``: one measurement, printed as JSON
    (a fresh process per measurement, as the other benchmarks take theirs)."""
    import json
    import sys

    obs, act, hidden, batch, seconds = (argv if argv is not None else sys.argv[1:])[:5]
    out = plain_sac_updates_per_s(
        obs_dim=int(obs),
        act_dim=int(act),
        hidden=tuple(int(h) for h in hidden.split(",")),
        batch=int(batch),
        seconds=float(seconds),
    )
    print(json.dumps(out))
    return out


if __name__ == "__main__":
    main()
