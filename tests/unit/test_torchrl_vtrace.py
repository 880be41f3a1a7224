"""crossrl's V-trace for TorchRL's IMPALA (``vtrace_taken_actions``): TorchRL's own V-trace maths, with the importance
weights taken on the actions the workers took. TorchRL 0.14.1's ``VTrace.forward`` weighs a freshly drawn action
instead; the second test shows it, and fails once TorchRL stops doing so (then the workaround can go)."""

from __future__ import annotations

import torch
from tensordict import TensorDict
from torchrl.modules import ValueOperator
from torchrl.objectives.value import VTrace
from torchrl.objectives.value.functional import vtrace_advantage_estimate

from crossrl.adapters.torchrl.algorithms import ACTION_KEY, OBS_KEY, build_actor, vtrace_taken_actions
from crossrl.core.models import build_mlp
from crossrl.scenarios.spec import ModelSpec

B, T, N_OBS, N_ACTIONS = 3, 6, 4, 3


def _setup(*, taken: str, lag: bool = False) -> tuple[VTrace, TensorDict, torch.Tensor]:
    """An estimator over a tiny actor and critic, and a batch whose actions are the policy's least likely
    (``taken="least"``) or most likely (``"mode"``) ones, with the behaviour log-probs of the same policy (no lag:
    every correct importance weight is 1), or with ``lag`` of an older policy that gave each taken action
    probability 0.9 (every weight below 1, so no clipping hides which action it was taken on). Returns the
    behaviour log-probs too."""
    torch.manual_seed(0)
    model = ModelSpec(hidden=[8])
    actor = build_actor(net=build_mlp(in_dim=N_OBS, out_dim=N_ACTIONS, model=model, out_gain=1.0), n_actions=N_ACTIONS)
    critic = ValueOperator(build_mlp(in_dim=N_OBS, out_dim=1, model=model), in_keys=[OBS_KEY])
    estimator = VTrace(gamma=0.99, value_network=critic, actor_network=actor, rho_thresh=1.0, c_thresh=1.0)
    obs, next_obs = torch.randn(B, T, N_OBS), torch.randn(B, T, N_OBS)
    with torch.no_grad():
        dist = actor.get_dist(TensorDict({OBS_KEY: obs}, batch_size=[B, T]))
        logits = dist.logits
        action = logits.argmin(-1) if taken == "least" else logits.argmax(-1)
        log_mu = torch.full((B, T), 0.9).log() if lag else dist.log_prob(action)
    done = torch.zeros(B, T, 1, dtype=torch.bool)
    done[:, 3] = True
    keys = estimator.tensor_keys
    data = TensorDict(
        {
            OBS_KEY: obs,
            ACTION_KEY: action,
            keys.sample_log_prob: log_mu,
            "next": {OBS_KEY: next_obs, "reward": torch.randn(B, T, 1), "done": done, "terminated": done.clone()},
        },
        batch_size=[B, T],
    )
    return estimator, data, log_mu


def test_the_importance_weights_are_those_of_the_actions_taken() -> None:
    for lag in (False, True):
        estimator, data, log_mu = _setup(taken="least", lag=lag)
        out = vtrace_taken_actions(estimator, data.clone())
        with torch.no_grad():
            value = estimator.value_network(data.select(OBS_KEY).copy())["state_value"]
            next_value = estimator.value_network(data["next"].select(OBS_KEY).copy())["state_value"]
            logits = estimator.actor_network.module[0](data.select(OBS_KEY).copy())["logits"]
        log_pi = torch.distributions.Categorical(logits=logits).log_prob(data[ACTION_KEY]).unsqueeze(-1)
        nxt = data["next"]
        adv, target = vtrace_advantage_estimate(
            0.99, log_pi, log_mu.unsqueeze(-1), value, next_value, nxt["reward"], nxt["done"], nxt["terminated"]
        )
        assert torch.allclose(out["advantage"], adv) and torch.allclose(out["value_target"], target), lag


def test_torchrls_own_vtrace_weighs_another_action_than_the_one_taken() -> None:
    """With the mode taken, TorchRL's VTrace and crossrl's agree (the same maths and inputs); with the least likely
    action taken, TorchRL's weighs the mode instead and its targets differ."""
    for taken in ("mode", "least"):
        estimator, data, _ = _setup(taken=taken, lag=True)
        ours = vtrace_taken_actions(estimator, data.clone())
        with torch.no_grad():
            theirs = estimator(data.clone())
        same = torch.allclose(ours["value_target"], theirs["value_target"], atol=1e-6)
        assert same == (taken == "mode"), taken
