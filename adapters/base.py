"""The one small contract between crossrl and an engine.

An engine adapter gets a :class:`~crossrl.scenarios.spec.Trial` and a :class:`MetricSink`; it builds
its engine, calls ``sink.start_clock()`` once set-up is done, trains until ``sink.exhausted``, and
calls ``sink.point(...)`` after every training iteration. The sink, not the engine, computes the
derived metrics (throughput, episode statistics) so that every engine is measured the same way.

Checkpoints, the same way on every engine::

    resumed = sink.resumed()            # set-up done, before start_clock
    if resumed is not None:             # --resume: restore the engine from resumed.path and continue its
        restore(resumed.path)           # counters at resumed.env_steps_sampled / env_steps_trained
    sink.start_clock()
    while not sink.exhausted:
        ...; sink.point(...)
        sink.checkpoint_if_due(save)    # save(folder): the engine's whole training state into folder
    sink.final_checkpoint(save)         # the trial ended normally: what `crossrl evaluate` reloads

The sink decides when (the spec's ``checkpoint`` section), writes atomically (crossrl.adapters.checkpoints), keeps
the newest ``keep``, stores the trial process's random states beside the engine's, and leaves the time spent
writing out of training time and throughput.
"""

from __future__ import annotations

import base64
import math
import pickle
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar, Protocol, runtime_checkable

from crossrl.adapters import checkpoints
from crossrl.adapters.checkpoints import Resumed
from crossrl.scenarios import metrics as M
from crossrl.scenarios.spec import Trial

Save = Callable[[Path], Mapping[str, Any] | None]
"""An engine's checkpoint writer: its whole training state into the given (empty) folder; it may return a small
JSON-able description of what it holds (stored in the checkpoint's ``crossrl.json``)."""


class TrainingDiverged(RuntimeError):
    """A loss or the gradient norm an engine reported is not finite: the trial ends FAILED, on every engine alike
    (its policy would otherwise collapse and the trial finish as a normal row)."""


_DIVERGED_BY = {
    name.rpartition(".")[2] for name in (M.POLICY_LOSS, M.VALUE_LOSS, M.DIAG_GRAD_NORM, M.DIAG_Q_MEAN)
}  # also a multi-agent trial's policy.<id>.<name>


@runtime_checkable
class Adapter(Protocol):
    """One engine. Implementations live one per module in ``crossrl.adapters``."""

    engine: ClassVar[str]

    def run(self, trial: Trial, sink: MetricSink) -> None:
        """Train ``trial`` until ``sink.exhausted``; report every iteration through ``sink.point``."""
        ...


class MetricSink:
    """Turns an engine's per-iteration report into common metric points.

    Subclasses decide where points go (:meth:`_emit`): a pipe to the runner, or a list in tests.
    ``episode_return_mean`` is the mean over the episodes completed since the previous point (absent
    from a point when none completed); ``sample_throughput`` is env steps sampled over the interval's
    wall seconds, learning included, for every engine alike.
    """

    def __init__(self, trial: Trial) -> None:
        self.trial = trial
        self._t0 = time.perf_counter()
        self._last_t = self._t0
        self._last_sampled = 0
        self._last_trained = 0
        self._episodes = 0
        self.env_steps_sampled = 0
        self.setup_s: float | None = None
        self.target_reached = False
        self.iterations = 0  # points so far
        self._point_train_s = 0.0  # the training seconds of the latest point (its wall_time_s)
        self.checkpoint_s = 0.0  # seconds spent writing checkpoints, left out of training time
        self.last_checkpoint: Path | None = None  # the folder of the newest checkpoint written
        self._resumed: Resumed | None = None
        if trial.resume_from is not None:
            folder = Path(trial.resume_from)
            self._resumed = Resumed.of(folder, checkpoints.read_meta(folder))
        self._ckpt_step = self._resumed.env_steps_sampled if self._resumed else 0
        self._ckpt_train_s = self._resumed.train_s if self._resumed else 0.0

    # -- called by adapters ------------------------------------------------------------------
    def resumed(self) -> Resumed | None:
        """The checkpoint this trial continues from (``crossrl run --resume``), or None for a trial from scratch. The
        adapter restores its engine from ``resumed.path`` before :meth:`start_clock` and counts env steps from
        ``resumed.env_steps_sampled`` / ``env_steps_trained``."""
        return self._resumed

    def start_clock(self) -> None:
        """Set-up is done; wall time (and time to target) counts from here (a resumed trial's from its checkpoint's
        training seconds, with its counters and the trial process's random states as they were)."""
        now = time.perf_counter()
        self.setup_s = now - self._t0
        self._t0 = self._last_t = now
        message: dict[str, Any] = {"kind": "setup", "setup_s": self.setup_s}
        r = self._resumed
        if r is not None:
            self._t0 -= r.train_s
            self.env_steps_sampled = self._last_sampled = r.env_steps_sampled
            self._last_trained = r.env_steps_trained
            self._episodes, self.iterations = r.episodes, r.iterations
            self._point_train_s = r.train_s
            if self.trial.resume_copy:  # another trial's checkpoint (PBT's exploit): this trial's own random streams
                checkpoints.seed_rngs(checkpoints.resume_seed(self.trial, r))
            else:
                with open(r.folder / checkpoints.RNG_FILE, "rb") as f:
                    checkpoints.set_rng_state(pickle.load(f))
            message |= {"resumed_from": str(r.folder), "resumed_env_step": r.env_steps_sampled, "train_s": r.train_s}
        self._emit(message)

    @property
    def current_checkpoint(self) -> Path | None:
        """The checkpoint written at the latest point (the final one, once training ended), or None."""
        return self.last_checkpoint if self._ckpt_step == self.env_steps_sampled else None

    @property
    def train_s(self) -> float:
        """Training seconds so far (checkpoint writes left out; a resumed trial's earlier ones included)."""
        return time.perf_counter() - self._t0 if self.setup_s is not None else 0.0

    def checkpoint_if_due(self, save: Save) -> None:
        """A checkpoint when the spec's interval (env steps or training seconds since the last one) has passed."""
        spec = self.trial.checkpoint
        if self.trial.checkpoint_dir is None or self.setup_s is None:
            return
        steps_due = (
            spec.every_env_steps is not None and self.env_steps_sampled - self._ckpt_step >= spec.every_env_steps
        )
        time_due = spec.every_seconds is not None and self.train_s - self._ckpt_train_s >= spec.every_seconds
        if steps_due or time_due:
            self.checkpoint(save)

    def final_checkpoint(self, save: Save) -> None:
        """Once training ended normally: one more checkpoint (``checkpoint.final``), unless one was just written."""
        if self.trial.checkpoint_dir is None or not self.trial.checkpoint.final or self.setup_s is None:
            return
        if self._ckpt_step != self.env_steps_sampled or self.iterations == 0:
            self.checkpoint(save, final=True)

    def checkpoint(self, save: Save, *, final: bool = False) -> Path | None:
        """Writes a checkpoint now (see :mod:`crossrl.adapters.checkpoints`); its time is left out of training time.
        A checkpoint that cannot be written (a full disk) is a warning: the trial goes on without it."""
        assert self.trial.checkpoint_dir is not None
        t0 = time.perf_counter()
        train_s = t0 - self._t0
        meta = {
            "trial": self.trial.name,
            "engine": self.trial.engine,
            "scenario": self.trial.scenario,
            "fingerprint": self.trial.fingerprint,
            "env_steps_sampled": self.env_steps_sampled,
            "env_steps_trained": self._last_trained,
            "iterations": self.iterations,
            "episodes": self._episodes,
            "train_s": train_s,
            "final": final,
        }
        root = Path(self.trial.checkpoint_dir)
        try:
            folder, size = checkpoints.write(root, step=self.env_steps_sampled, save=save, meta=meta)
            checkpoints.prune(root, self.trial.checkpoint.keep)
        except OSError as e:
            folder = None
            self._emit({"kind": "warning", "message": f"no checkpoint at env step {self.env_steps_sampled}: {e}"})
        dt = time.perf_counter() - t0
        self._t0 += dt  # out of training time, and out of the next point's throughput interval
        self._last_t += dt
        self.checkpoint_s += dt
        self._ckpt_step, self._ckpt_train_s = self.env_steps_sampled, train_s
        self.last_checkpoint = folder
        if folder is not None:
            self._emit(
                {
                    "kind": "checkpoint",
                    "path": str(folder),
                    "env_step": self.env_steps_sampled,
                    "train_s": train_s,
                    "bytes": size,
                    "write_s": dt,
                    "final": final,
                }
            )
        return folder

    @property
    def exhausted(self) -> bool:
        """True once the env-step budget is sampled, the training time (``budget.train_seconds``, from
        :meth:`start_clock`) has passed at the latest point, or the target is reached with ``budget.stop_at_target``.
        The time is the latest point's, not the clock's now: a trial ends on a point at or past its training time, so
        its curve reaches the budget (the clock read a moment after the point could pass it first)."""
        budget = self.trial.budget
        if budget.stop_at_target and self.target_reached:
            return True
        if budget.train_seconds is not None and self._point_train_s >= budget.train_seconds:
            return True
        return budget.env_steps is not None and self.env_steps_sampled >= budget.env_steps

    def point(
        self,
        *,
        env_steps_sampled: int,
        env_steps_trained: int | None = None,
        episode_returns: Sequence[float] = (),
        episode_lengths: Sequence[int] = (),
        values: Mapping[str, float] | None = None,
    ) -> None:
        """Record one iteration. ``env_steps_*`` are cumulative; episodes are those completed since the last call.

        ``values`` carries the other common metrics the engine knows (losses, entropy, timings,
        ``worker_restarts``), already translated to the names in :mod:`crossrl.scenarios.metrics`, and its
        diagnostics as ``diag.<name>``.
        """
        now = time.perf_counter()
        dt = max(now - self._last_t, 1e-9)
        trained = env_steps_trained if env_steps_trained is not None else env_steps_sampled
        out: dict[str, float] = {}
        self.iterations += 1
        for k, v in (values or {}).items():
            if not M.is_point_metric(k):
                raise KeyError(f"{k!r} is neither a common metric name nor diag.* (crossrl.scenarios.metrics)")
            if v is not None and math.isfinite(float(v)):
                out[k] = float(v)
            elif v is not None and k.rpartition(".")[2] in _DIVERGED_BY:
                raise TrainingDiverged(f"training diverged at iteration {self.iterations}: {k} is {float(v)}")
        out[M.ENV_STEPS_SAMPLED] = float(env_steps_sampled)
        out[M.ENV_STEPS_TRAINED] = float(trained)
        out[M.WALL_TIME_S] = self._point_train_s = now - self._t0
        out[M.SAMPLE_THROUGHPUT] = (env_steps_sampled - self._last_sampled) / dt
        out[M.TRAIN_THROUGHPUT] = (trained - self._last_trained) / dt
        self._episodes += len(episode_returns)
        out[M.EPISODES_TOTAL] = float(self._episodes)
        if len(episode_returns):
            out[M.EPISODE_RETURN_MEAN] = float(sum(episode_returns) / len(episode_returns))
            out[M.EPISODES_THIS_POINT] = float(len(episode_returns))
            target = self.trial.target_return
            if target is not None and out[M.EPISODE_RETURN_MEAN] >= target:
                self.target_reached = True  # the same rule as the runner's steps_to_target
        if len(episode_lengths):
            out[M.EPISODE_LEN_MEAN] = float(sum(episode_lengths) / len(episode_lengths))
        self._last_t, self._last_sampled, self._last_trained = now, env_steps_sampled, trained
        self.env_steps_sampled = env_steps_sampled
        self._emit({"kind": "point", "step": int(env_steps_sampled), "values": out})

    def native_config(self, config: Mapping[str, Any]) -> None:
        """The engine's resolved native config, stored as an artifact for audit; with the trial's engine-native
        settings (the spec's ``native`` section for this engine, as written) under ``crossrl_native_settings``."""
        if self.trial.native:
            config = {**config, NATIVE_SETTINGS_KEY: self.trial.native}
        self._emit({"kind": "native_config", "config": _jsonable(config)})

    def tags(self, **tags: str) -> None:
        """Extra tags for the trial's run, e.g. ``engine_version``."""
        self._emit({"kind": "tags", "tags": {k: str(v) for k, v in tags.items()}})

    def artifact(self, name: str, data: bytes) -> None:
        """A binary file stored as the trial's artifact ``name`` (e.g. ``clip.gif``); base64 in the message."""
        self._emit({"kind": "artifact", "name": name, "data": base64.b64encode(data).decode("ascii")})

    # -- transport -------------------------------------------------------------------------------
    def _emit(self, message: dict[str, Any]) -> None:
        raise NotImplementedError


NATIVE_SETTINGS_KEY = "crossrl_native_settings"
"""Where a trial's native config holds the engine-native settings it ran with (they break the equal-settings rule)."""


class ListSink(MetricSink):
    """Keeps every message in memory (tests, in-process runs)."""

    def __init__(self, trial: Trial) -> None:
        super().__init__(trial)
        self.messages: list[dict[str, Any]] = []

    def _emit(self, message: dict[str, Any]) -> None:
        self.messages.append(message)

    @property
    def points(self) -> list[dict[str, float]]:
        return [m["values"] for m in self.messages if m["kind"] == "point"]


CLIP_TAGS = ("clip", "clip.score", "clip.length", "clip.ended", "clip.seed", "clip.policy")
"""The trial's tags about its clip: the artifact's name, the episode's raw score, its length in env steps, whether it
ended within the frame cap, the seed it was reset with, where its policy came from (read by
``crossrl.reports.render``)."""


def send_clip(sink: MetricSink, make_act: Callable[[], Callable[[Any], Any]]) -> None:
    """Once training has ended, on a single-agent pixel env: one episode of the final policy from the trial's seed
    (:func:`crossrl.core.clips.record_episode`), sent as the trial's artifact ``clip.gif`` with its score and
    length as tags (:data:`CLIP_TAGS`). ``make_act()`` gives the engine's greedy rule (argmax of the logits or
    Q-values) for one observation. When the trial has just written its final checkpoint, the policy is reloaded from it
    the way ``crossrl evaluate`` does (the engine's ``policy_loader``), so a clip shows what a checkpoint holds; else
    ``make_act()``. Never raises: a clip that cannot be made is a warning line in the trial's log."""
    trial = sink.trial
    if trial.env.multi_agent or trial.env.resolved_preprocessing not in ("atari", "minatar"):
        return
    try:
        from crossrl.adapters.registry import engine_info, load_target
        from crossrl.core.clips import CLIP_FORMAT, encode_clip, record_episode

        t0 = time.perf_counter()
        folder, loader = sink.current_checkpoint, engine_info(trial.engine).policy_loader
        act: Callable[[Any], Any]
        if folder is not None and loader is not None:
            load_policy: Any = load_target(loader)
            act = load_policy(trial, folder / checkpoints.ENGINE_DIR, greedy=True)
            source = f"checkpoint {folder.name}"
        else:
            act, source = make_act(), "the live engine"
        rec = record_episode(trial.env, act, seed=trial.seed)
        data = encode_clip(rec.frames, rec.fps)
        name = f"clip.{CLIP_FORMAT}"
        sink.artifact(name, data)
        values = (name, f"{rec.score:g}", str(rec.length), str(rec.ended).lower(), str(trial.seed), source)
        sink.tags(**dict(zip(CLIP_TAGS, values, strict=True)))
        print(
            f"clip: {len(rec.frames)} frames, score {rec.score:g} in {rec.length} steps, {len(data) / 1024:.0f} KiB, "
            f"{time.perf_counter() - t0:.1f} s",
            file=sys.stderr,
            flush=True,
        )
    except Exception as e:  # noqa: BLE001 - a clip is an extra: the trial stands without it
        print(f"warning: no clip of the final policy: {type(e).__name__}: {e}", file=sys.stderr, flush=True)


def signature_keywords(cls: type, method: str = "__init__") -> list[str]:
    """The keyword arguments ``cls.<method>`` names in its real signature (``inspect.signature``); a definition that
    passes ``**kwargs`` on (RLlib's PPOConfig.training to AlgorithmConfig.training, TorchRL's Collector) adds those of
    the next one up the class's MRO. What an engine-native setting (the spec's ``native``) is checked against."""
    import inspect

    names: list[str] = []
    for klass in cls.__mro__:
        fn = vars(klass).get(method)
        if fn is None or klass is object:
            continue
        params = list(inspect.signature(fn).parameters.values())[1:]  # self
        kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
        names += [p.name for p in params if p.kind in kinds and p.name not in names]
        if not any(p.kind == inspect.Parameter.VAR_KEYWORD for p in params):
            break
    return names


def _jsonable(obj: Any) -> Any:
    """Best-effort conversion of a native config to JSON types (unknown objects become their repr)."""
    if isinstance(obj, Mapping):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple | set | frozenset):
        return [_jsonable(v) for v in obj]
    if obj is None or isinstance(obj, bool | int | str):
        return obj
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else str(obj)
    return repr(obj)
