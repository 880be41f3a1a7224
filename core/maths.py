"""Return and advantage estimators as pure numpy functions on time-major ``[T, N]`` arrays.

Conventions shared by every function here (T env steps of N vector envs, row t = one transition):

- ``terminated[t]``: the episode ended in a terminal state at step t; nothing is bootstrapped.
- ``truncated[t]``: the episode was cut (time limit); its return is bootstrapped with
  ``next_values[t]``, the value of the episode's *final* observation.
- ``next_values[t]``: V(next obs of row t). For a row inside an episode it is the next row's value; at a
  truncation it is V(final obs); at the fragment's last row it is the bootstrap value.
- ``valid[t]`` (optional, default all True): False on gymnasium's autoreset rows (the step after an
  episode ended: the env ignores the action, returns the reset observation and reward 0). Such rows are
  not transitions: their outputs are 0 (advantages, returns) and no recursion passes through them.

Every function checks shapes and names what is wrong.
"""

from __future__ import annotations

import numpy as np


def _check(name: str, ref_shape: tuple[int, ...], **arrays: np.ndarray | None) -> None:
    if len(ref_shape) != 2:
        raise ValueError(f"{name}: rewards must be time-major [T, N], got shape {ref_shape}")
    for key, arr in arrays.items():
        if arr is not None and np.shape(arr) != ref_shape:
            raise ValueError(f"{name}: {key} has shape {np.shape(arr)}, expected {ref_shape} like rewards [T, N]")


def _chain(terminated: np.ndarray, truncated: np.ndarray, valid: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """(valid[T,N] bool, chain[T,N] float): chain[t] = 1 when step t's episode continues into row t+1."""
    done = terminated.astype(bool) | truncated.astype(bool)
    ok = np.ones(done.shape, bool) if valid is None else valid.astype(bool)
    # The fragment's last row chains into nothing: its next_values already bootstrap.
    nxt_ok = np.concatenate([ok[1:], np.zeros((1, ok.shape[1]), bool)], axis=0)
    return ok, (ok & ~done & nxt_ok).astype(np.float64)


def _reverse_discounted_sum(x: np.ndarray, coef: np.ndarray) -> np.ndarray:
    """``y[T-1] = x[T-1]``, ``y[t] = x[t] + coef[t] * y[t+1]`` over the leading (time) axis, float64.

    A doubling scan: after the pass with offset ``d``, ``y[t]`` holds the terms ``t .. t + 2d - 1`` and ``a[t]`` the
    product of their coefficients, so ``log2(T)`` passes over the whole array replace ``T`` passes over one row
    each (a 250 x 8 fragment: ~60 us instead of ~165 us; the sums' order differs, not their terms).
    """
    y = np.array(x, np.float64)
    a = np.array(coef, np.float64)
    d, n = 1, len(y)
    while d < n:
        y[:-d] += a[:-d] * y[d:]  # the right side is evaluated first: y[d:] as it was before this pass
        if 2 * d < n:
            a[:-d] *= a[d:]  # numpy copies the overlapping operand first
        d *= 2
    return y


def gae(
    *,
    rewards: np.ndarray,
    values: np.ndarray,
    next_values: np.ndarray,
    terminated: np.ndarray,
    truncated: np.ndarray,
    gamma: float,
    lam: float,
    valid: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Generalized advantage estimation (Schulman et al. 2016).

    ``delta_t = r_t + gamma * (1 - terminated_t) * next_values_t - values_t``;
    ``A_t = delta_t + gamma * lam * [episode continues] * A_{t+1}``. The fragment's last row chains into
    nothing (its ``next_values`` already bootstraps). Returns ``(advantages, value_targets)``, both
    ``[T, N]`` float64, ``value_targets = advantages + values`` (0 and ``values`` on invalid rows).
    """
    r = np.asarray(rewards, np.float64)
    _check(
        "gae",
        r.shape,
        values=values,
        next_values=next_values,
        terminated=terminated,
        truncated=truncated,
        valid=valid,
    )
    ok, chain = _chain(np.asarray(terminated), np.asarray(truncated), valid)
    v = np.asarray(values, np.float64)
    not_term = 1.0 - np.asarray(terminated, np.float64)
    delta = np.where(ok, r + gamma * not_term * np.asarray(next_values, np.float64) - v, 0.0)
    adv = _reverse_discounted_sum(delta, gamma * lam * chain)
    return adv, np.where(ok, adv + v, v)


def discounted_returns(
    *,
    rewards: np.ndarray,
    next_values: np.ndarray,
    terminated: np.ndarray,
    truncated: np.ndarray,
    gamma: float,
    valid: np.ndarray | None = None,
) -> np.ndarray:
    """Monte-Carlo returns bootstrapped where an episode is cut: ``R_t = r_t + gamma * (1 - term_t) * R'``.

    ``R'`` is ``R_{t+1}`` inside an episode, ``next_values_t`` at a truncation or the fragment's end.
    Equals :func:`gae` with ``lam = 1`` plus the values. Returns ``[T, N]`` float64 (0 on invalid rows).
    """
    r = np.asarray(rewards, np.float64)
    _check(
        "discounted_returns",
        r.shape,
        next_values=next_values,
        terminated=terminated,
        truncated=truncated,
        valid=valid,
    )
    ok, chain = _chain(np.asarray(terminated), np.asarray(truncated), valid)
    not_term = 1.0 - np.asarray(terminated, np.float64)
    nv = np.asarray(next_values, np.float64)
    out = np.zeros_like(r)
    acc = np.zeros(r.shape[1])
    for t in range(r.shape[0] - 1, -1, -1):
        nxt = chain[t] * acc + (1.0 - chain[t]) * nv[t]
        acc = np.where(ok[t], r[t] + gamma * not_term[t] * nxt, 0.0)
        out[t] = acc
    return out


def n_step_returns(
    *,
    rewards: np.ndarray,
    terminated: np.ndarray,
    truncated: np.ndarray,
    gamma: float,
    n: int,
    valid: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """n-step targets for Q-learning: ``y_t = returns_t + discounts_t * max_a Q(next_obs[last_t], a)``.

    ``returns_t`` sums ``gamma**k * r_{t+k}`` over up to ``n`` rows of the same episode (fewer at the
    episode's end or the fragment's end); ``last_t`` is the row index (along T) of the window's last
    transition, whose NEXT_OBS is the bootstrap observation; ``discounts_t = gamma**len`` or 0 when the
    episode terminated inside the window (a truncation still bootstraps, from the final observation).
    Returns ``(returns float64, discounts float64, last int64)``, each ``[T, N]``; invalid rows: 0, 0, t.
    """
    if n < 1:
        raise ValueError(f"n_step_returns: n={n} must be >= 1")
    r = np.asarray(rewards, np.float64)
    _check("n_step_returns", r.shape, terminated=terminated, truncated=truncated, valid=valid)
    ok, chain = _chain(np.asarray(terminated), np.asarray(truncated), valid)
    term = np.asarray(terminated, bool)
    T, N = r.shape
    returns = np.zeros_like(r)
    discounts = np.zeros_like(r)
    last = np.tile(np.arange(T)[:, None], (1, N))
    cols = np.arange(N)
    for t in range(T):
        alive = ok[t].copy()  # window still open for this env
        ret = np.zeros(N)
        disc = np.ones(N)
        end = np.full(N, t)
        for k in range(n):
            row = t + k
            if row >= T:
                break
            ret = np.where(alive, ret + disc * r[row], ret)
            end = np.where(alive, row, end)
            disc = np.where(alive, disc * gamma, disc)
            disc = np.where(alive & term[row], 0.0, disc)
            alive = alive & (chain[row] > 0)
        returns[t] = np.where(ok[t], ret, 0.0)
        discounts[t] = np.where(ok[t], disc, 0.0)
        last[t, cols] = end
    return returns, discounts, last


def vtrace(
    *,
    behaviour_logp: np.ndarray,
    target_logp: np.ndarray,
    rewards: np.ndarray,
    values: np.ndarray,
    next_values: np.ndarray,
    terminated: np.ndarray,
    truncated: np.ndarray,
    gamma: float,
    clip_rho: float = 1.0,
    clip_c: float = 1.0,
    valid: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """V-trace targets (Espeholt et al. 2018, eq. 1) and policy-gradient advantages.

    ``rho_t = min(clip_rho, pi/mu)``, ``c_t = min(clip_c, pi/mu)`` with ``pi`` the learner's (target)
    policy and ``mu`` the behaviour policy that sampled the actions;
    ``vs_t - V_t = rho_t * delta_t + gamma * c_t * [episode continues] * (vs_{t+1} - V_{t+1})``,
    ``delta_t = r_t + gamma * (1 - term_t) * next_values_t - V_t``;
    ``pg_adv_t = rho_t * (r_t + gamma * (1 - term_t) * vs'_{t+1} - V_t)`` where ``vs'`` is ``vs_{t+1}``
    inside an episode and ``next_values_t`` where it was cut. Returns ``(vs, pg_advantages)`` ``[T, N]``.
    """
    r = np.asarray(rewards, np.float64)
    _check(
        "vtrace",
        r.shape,
        behaviour_logp=behaviour_logp,
        target_logp=target_logp,
        values=values,
        next_values=next_values,
        terminated=terminated,
        truncated=truncated,
        valid=valid,
    )
    ok, chain = _chain(np.asarray(terminated), np.asarray(truncated), valid)
    v = np.asarray(values, np.float64)
    nv = np.asarray(next_values, np.float64)
    not_term = 1.0 - np.asarray(terminated, np.float64)
    ratio = np.exp(np.asarray(target_logp, np.float64) - np.asarray(behaviour_logp, np.float64))
    rho = np.minimum(clip_rho, ratio)
    c = np.minimum(clip_c, ratio)
    delta = np.where(ok, rho * (r + gamma * not_term * nv - v), 0.0)
    diff = np.zeros_like(r)
    acc = np.zeros(r.shape[1])
    for t in range(r.shape[0] - 1, -1, -1):
        acc = delta[t] + gamma * c[t] * chain[t] * acc
        diff[t] = acc
    vs = v + diff
    vs_next = np.concatenate([vs[1:], nv[-1:]], axis=0)
    vs_next = chain * vs_next + (1.0 - chain) * nv
    pg_adv = np.where(ok, rho * (r + gamma * not_term * vs_next - v), 0.0)
    return np.where(ok, vs, v), pg_adv


def mean_stats(stats: list[dict[str, float]]) -> dict[str, float]:
    """Key-wise mean of learner stats dicts (minibatches, learner steps, workers' gradient infos).

    Every key any dict has is averaged over the dicts that have it; an empty list gives ``{}``.
    """
    keys = dict.fromkeys(k for s in stats for k in s)  # first-seen order
    return {k: float(np.mean([s[k] for s in stats if k in s])) for k in keys}
