"""Pure-sampling speed (env steps/s, no learning) of one contestant, each measurement in a fresh process.

One function per contestant: :func:`sample_raw` (gymnasium's vector env, random actions, one process
per worker: the env's own limit), :func:`sample_limit` (the same processes running the policy network's
batched forward pass every step, no framework: the sampling limit), :func:`sample_crossrl` (crossrl's
evaluator actors under a real policy optimizer, random weights), :func:`sample_rllib` (RLlib 2.60 env runners), :func:`sample_torchrl`
(TorchRL 0.14 collectors). Like the runner's trials, every call starts
``python -m crossrl.measure.bench._child`` in its own session, so Ray clusters, torch threads and
imports of one contestant cannot leak into the next; the code that runs there is
:mod:`crossrl.measure.bench.contestants`.

Every contestant does the same work per iteration: one weight broadcast, then ``fragment`` env steps
on each of the ``workers x envs_per_worker`` envs, gathered on the driver. Env steps are transitions
(gymnasium's autoreset steps are not counted), timed over the driver's wall clock.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from crossrl.scenarios import catalog
from crossrl.scenarios.spec import DEFAULT_TRANSPORT, EnvSpec, ModelSpec

AUTO_TRAIN_BATCH = 4000  # PPO's train batch in the catalog: what "auto" fragments add up to per iteration


def auto_fragment(workers: int, envs_per_worker: int) -> int:
    """``ceil(4000 / (workers x envs))``: the fragment PPO samples with by default on every engine (crossrl's
    sync_samples, RLlib's ``rollout_fragment_length="auto"``, TorchRL's frames_per_batch split), so the
    bench times the sampling that a real PPO run does: 500 env steps per env at 1 x 8, 250 at 2 x 8."""
    return -(-AUTO_TRAIN_BATCH // (workers * envs_per_worker))


DEFAULT_MODEL = ModelSpec(hidden=(64, 64), activation="tanh")
DEFAULT_FRAGMENT = 128  # env steps per env per iteration: 1024 per worker at 8 envs
SETUP_TIMEOUT_S = 300.0  # Ray + RLlib start-up on a busy 2-core machine, on top of the timed part


def default_model(env_spec: EnvSpec) -> ModelSpec:
    """The model a bench samples ``env_spec`` with when none is given: the suite's standard conv model for a pixel
    env (``catalog.PIXEL_MODELS`` by its resolved preprocessing: MinAtar's one-conv net, Atari's Nature CNN), else
    :data:`DEFAULT_MODEL` (a 64x64 tanh MLP)."""
    if env_spec.multi_agent:
        return DEFAULT_MODEL
    pixel = catalog.PIXEL_MODELS.get(env_spec.resolved_preprocessing)
    return ModelSpec.model_validate(pixel) if pixel is not None else DEFAULT_MODEL


@dataclass
class SamplerResult:
    """One contestant at one size. ``steps_per_s``: one figure per timed window (env steps/s)."""

    engine: str
    workers: int
    envs_per_worker: int
    steps_per_s: list[float] = field(default_factory=list)
    optimizer: str | None = None  # crossrl only: the policy optimizer whose sampling was timed
    info: dict[str, Any] = field(default_factory=dict)
    peak_rss_mb: list[float] | None = None  # per env-stepping process (MiB), when asked for
    cpu: dict[str, float] | None = None  # CPUs in use while timed: machine_busy_cpus, workers_cpus, driver_cpus
    fragment: int | None = None  # env steps per env per iteration it was timed with
    transport: str | None = None  # crossrl only: how its fragments travelled (crossrl.core.transport)
    layout: dict[str, Any] | None = None  # rllib / torchrl: the execution layout timed (None: the bench's fixed one)

    @property
    def label(self) -> str:
        """``engine[/optimizer]``, with ``+<transport>`` when crossrl ran on a transport other than the default."""
        base = self.engine if self.optimizer is None else f"{self.engine}/{self.optimizer}"
        return base if self.transport in (None, DEFAULT_TRANSPORT) else f"{base}+{self.transport}"


class BenchError(RuntimeError):
    """A measurement process failed; the message carries the end of its log."""


def measure(
    engine: str,
    *,
    env_spec: EnvSpec,
    workers: int,
    envs_per_worker: int,
    model: ModelSpec = DEFAULT_MODEL,
    seconds: float = 3.0,
    warmup_s: float = 1.0,
    windows: int = 1,
    fragment: int = DEFAULT_FRAGMENT,
    optimizer: str | None = None,
    profile_path: Path | None = None,
    rss: bool = False,
    transport: str | None = None,
    hyperparams: dict[str, Any] | None = None,
    layout: dict[str, Any] | None = None,
) -> SamplerResult:
    """Time ``engine`` ("raw", "limit", "crossrl", "rllib", "torchrl", or "learner": PPO's learning step alone on a
    stored batch, with ``hyperparams``) in a fresh process.

    After set-up and ``warmup_s`` seconds of iterations, ``windows`` windows of ``seconds`` each are
    timed (each ends on an iteration boundary). ``profile_path``: also write a cProfile dump of the
    measurement process's driver (for crossrl that is the driver, not the evaluator actors).
    ``rss``: also read each env-stepping process's peak RSS (Linux VmHWM) after the timed part.
    ``layout``: rllib and torchrl only, the engine's execution layout (:mod:`.layouts`: env runners and their
    vectorisation, collector and batched env...) for the same ``workers x envs_per_worker`` envs; None: the
    bench's fixed layout (:func:`.layouts.fixed_layout`).
    """
    if workers < 1 or envs_per_worker < 1 or fragment < 1 or windows < 1 or seconds <= 0:
        raise ValueError(
            f"bench: workers={workers}, envs_per_worker={envs_per_worker}, fragment={fragment}, "
            f"windows={windows} must be >= 1 and seconds={seconds} > 0"
        )
    request = {
        "engine": engine,
        "env_spec": env_spec.model_dump(mode="json"),
        "workers": workers,
        "envs_per_worker": envs_per_worker,
        "model": model.model_dump(mode="json"),
        "seconds": seconds,
        "warmup_s": warmup_s,
        "windows": windows,
        "fragment": fragment,
        "optimizer": optimizer,
        "transport": transport,
        "hyperparams": hyperparams,
        "profile": str(profile_path) if profile_path else None,
        "rss": rss,
        "layout": layout,
    }
    timeout = SETUP_TIMEOUT_S + warmup_s + windows * seconds * 3
    result = run_child(request, timeout_s=timeout)
    return SamplerResult(
        engine=engine,
        workers=workers,
        envs_per_worker=envs_per_worker,
        steps_per_s=[float(x) for x in result["samples"]],
        optimizer=optimizer if engine == "crossrl" else None,
        info=result.get("info", {}),
        peak_rss_mb=result.get("peak_rss_mb"),
        cpu=result.get("cpu"),
        fragment=fragment,
        transport=(transport or DEFAULT_TRANSPORT) if engine == "crossrl" else None,
        layout=layout,
    )


def run_child(request: dict[str, Any], *, timeout_s: float) -> dict[str, Any]:
    """Run one measurement process (own session) and return its JSON result; raise :class:`BenchError`."""
    from crossrl.orchestration.procs import kill_tree
    from crossrl.orchestration.runner import child_env

    with tempfile.TemporaryDirectory(prefix="crossrl-bench-") as tmp:
        req, res, log = Path(tmp) / "request.json", Path(tmp) / "result.json", Path(tmp) / "child.log"
        req.write_text(json.dumps(request))
        with open(log, "wb") as out:
            proc = subprocess.Popen(
                [sys.executable, "-m", "crossrl.measure.bench._child", str(req), str(res)],
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                # a cluster of its own: core.cluster.connect starts Ray with address="local"
                env=child_env(),
            )
            try:
                code = proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                kill_tree(proc.pid, grace_s=0)  # a hung measurement: SIGKILL it and its Ray cluster
                proc.wait()
                raise BenchError(
                    f"{request['engine']}: no result within {timeout_s:.0f} s; log:\n{_tail(log)}"
                ) from None
        if code != 0 or not res.exists():
            raise BenchError(f"{request['engine']}: measurement process exited with {code}; log:\n{_tail(log)}")
        data: dict[str, Any] = json.loads(res.read_text())
        return data


def _tail(path: Path, chars: int = 3000) -> str:
    return path.read_text(errors="replace")[-chars:]


def sample_raw(*, env_spec: EnvSpec, workers: int, envs_per_worker: int, seconds: float, **kw: Any) -> SamplerResult:
    """The env's own limit: ``crossrl.core.envs.make_vector_env`` with random actions, one process per worker."""
    return measure("raw", env_spec=env_spec, workers=workers, envs_per_worker=envs_per_worker, seconds=seconds, **kw)


def sample_limit(*, env_spec: EnvSpec, workers: int, envs_per_worker: int, seconds: float, **kw: Any) -> SamplerResult:
    """The sampling limit: ``make_vector_env`` and the policy network's batched forward pass every step, one process
    per worker, no framework and no transport beyond a count per iteration."""
    return measure("limit", env_spec=env_spec, workers=workers, envs_per_worker=envs_per_worker, seconds=seconds, **kw)


def sample_crossrl(
    *,
    env_spec: EnvSpec,
    workers: int,
    envs_per_worker: int,
    seconds: float,
    optimizer: str = "sync_samples",
    **kw: Any,
) -> SamplerResult:
    """crossrl: ``workers`` evaluator actors x ``envs_per_worker`` envs under ``optimizer``'s own ``step()``.

    The policy is PPO's (random-weights MLP) with a no-op ``learn_on_batch``, so what is timed is the
    optimizer's sampling path: sync_samples broadcasts weights (one ``ray.put``) and gathers one
    batch per actor; async_samples keeps one ``sample`` in flight per actor and feeds its learner
    thread (which learns nothing, but still re-broadcasts weights after each "update").
    """
    return measure(
        "crossrl",
        env_spec=env_spec,
        workers=workers,
        envs_per_worker=envs_per_worker,
        seconds=seconds,
        optimizer=optimizer,
        **kw,
    )


def sample_rllib(*, env_spec: EnvSpec, workers: int, envs_per_worker: int, seconds: float, **kw: Any) -> SamplerResult:
    """RLlib 2.60: an EnvRunnerGroup (num_env_runners=workers) sampled as PPO's training_step does."""
    return measure("rllib", env_spec=env_spec, workers=workers, envs_per_worker=envs_per_worker, seconds=seconds, **kw)


def sample_torchrl(
    *, env_spec: EnvSpec, workers: int, envs_per_worker: int, seconds: float, **kw: Any
) -> SamplerResult:
    """TorchRL 0.14: Collector (1 worker) or MultiSyncCollector over SerialEnv(GymWrapper(make_env))."""
    return measure(
        "torchrl", env_spec=env_spec, workers=workers, envs_per_worker=envs_per_worker, seconds=seconds, **kw
    )


SAMPLERS = {
    "raw": sample_raw,
    "limit": sample_limit,
    "crossrl": sample_crossrl,
    "rllib": sample_rllib,
    "torchrl": sample_torchrl,
}
