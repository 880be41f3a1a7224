"""``crossrl bench transport``: what carrying one fragment costs on each sample transport, with sampling taken out.

One remote evaluator per transport (:mod:`crossrl.core.transport`: ``calls``, ``stream``) whose ``sample`` hands
back one real batch of the asked-for shape, sampled once and kept (:class:`CannedEvaluator`), so what is timed is
everything else a fragment costs: the request with new weights, setting them, sending the batch, receiving and
unpickling it on the driver. Rounds alternate the transports (A B A B ...); each round runs ``fragments``
iterations of ``broadcast_weights(with_next_sample=True)`` + ``EvaluatorSet.sample``, as ``sync_samples`` does,
and reads the CPU time of the evaluator's process and of the driver around them.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from crossrl.core.evaluator import PolicyEvaluator
from crossrl.core.sample_batch import SampleBatch
from crossrl.measure.bench.results import write_result
from crossrl.scenarios.spec import TRANSPORTS, EnvSpec, ModelSpec


class CannedEvaluator(PolicyEvaluator):
    """Takes weights like any evaluator, but returns one stored batch per fragment size instead of sampling."""

    _canned: dict[int, SampleBatch]

    def sample(
        self,
        num_steps: int,
        weights: dict[str, np.ndarray] | bytes | None = None,
        version: int | None = None,
        epsilon: float | None = None,
    ) -> SampleBatch:
        if weights is not None and (version is None or version != self.weights_version):
            self.set_weights(weights, version)
        canned = self.__dict__.setdefault("_canned", {})
        if num_steps not in canned:
            canned[num_steps] = super().sample(num_steps)
        return canned[num_steps]  # type: ignore[no-any-return]


@dataclass
class TransportRow:
    """One transport: per-fragment figures, one per round (microseconds)."""

    transport: str
    actor_cpu_us: list[float] = field(default_factory=list)
    driver_cpu_us: list[float] = field(default_factory=list)
    wall_us: list[float] = field(default_factory=list)

    def median(self, name: str) -> float:
        return float(statistics.median(getattr(self, name)))


@dataclass
class TransportTable:
    env_id: str
    fragment: int
    envs: int
    batch_kib: float
    weights_kib: float
    rows: list[TransportRow]
    conditions: dict[str, Any] = field(default_factory=dict)

    def row(self, transport: str) -> TransportRow:
        return next(r for r in self.rows if r.transport == transport)

    def to_dict(self) -> dict[str, Any]:
        return {
            **{k: v for k, v in asdict(self).items() if k != "rows"},
            "rows": [
                {**asdict(r), **{f"{n}_median": r.median(n) for n in ("actor_cpu_us", "driver_cpu_us", "wall_us")}}
                for r in self.rows
            ],
        }

    def to_json(self, path: Path) -> Path:
        return write_result(path, "transport", self.to_dict())

    def metrics(self) -> dict[str, float]:
        out = {}
        for r in self.rows:
            for n in ("actor_cpu_us", "driver_cpu_us", "wall_us"):
                out[f"{r.transport}.{n}"] = r.median(n)
        return out


def bench_transport(
    *,
    env_id: str = "CartPole-v1",
    fragment: int = 64,
    envs: int = 1,
    fragments: int = 300,
    repeat: int = 3,
    transports: Sequence[str] = TRANSPORTS,
    model: ModelSpec | None = None,
    progress: Callable[[str], None] | None = None,
) -> TransportTable:
    """Per-fragment CPU of the evaluator and the driver, and wall time, on each transport (see the module).
    ``model``: the policy's network; None: the bench's default for the env (the suite's conv model on pixels)."""
    import psutil
    import ray

    from crossrl.core.algorithms import load
    from crossrl.core.cluster import disconnect
    from crossrl.core.evaluator import EvaluatorSet
    from crossrl.core.policy import PolicySpec
    from crossrl.measure.bench.base import ray_up
    from crossrl.measure.bench.contestants import alg_defaults, process_cpu_s
    from crossrl.measure.bench.samplers import default_model

    if fragment < 1 or envs < 1 or fragments < 1 or repeat < 1:
        raise ValueError(f"bench transport: fragment={fragment}, envs={envs}, fragments={fragments}, "
                         f"repeat={repeat} must be >= 1")  # fmt: skip
    ray_up(len(transports))
    alg = load("ppo")
    env_spec = EnvSpec(id=env_id)
    model = model or default_model(env_spec)
    factory = PolicySpec(policy_cls=alg.policy_cls, hyperparams=alg.hyperparams(alg_defaults("ppo")), model=model)
    sets = {
        t: EvaluatorSet(
            env_spec=env_spec,
            num_envs=envs,
            policy_factory=factory,
            num_remote=1,
            seed=0,
            evaluator_cls=CannedEvaluator,
            transport=t,
        )  # fmt: skip
        for t in transports
    }
    try:
        actors = {t: psutil.Process(ray.get(s.remotes[0].apply.remote(_pid))) for t, s in sets.items()}
        driver = psutil.Process(os.getpid())
        rows = {t: TransportRow(t) for t in transports}
        batch = weights = 0.0
        for s in sets.values():  # warm-up: the stream connects, the batch is canned, caches fill
            for _ in range(20):
                s.broadcast_weights(with_next_sample=True)
                got = s.sample(num_steps=fragment)
        batch = sum(v.nbytes for v in got[0].values()) / 1024
        weights = sum(v.nbytes for v in sets[transports[0]].local.get_weights().values()) / 1024
        for r in range(repeat):
            for t, s in sets.items():
                a0, d0, w0 = process_cpu_s(actors[t]), process_cpu_s(driver), time.perf_counter()
                for _ in range(fragments):
                    s.broadcast_weights(with_next_sample=True)
                    s.sample(num_steps=fragment)
                w1, a1, d1 = time.perf_counter(), process_cpu_s(actors[t]), process_cpu_s(driver)
                row = rows[t]
                row.actor_cpu_us.append(1e6 * (a1 - a0) / fragments)
                row.driver_cpu_us.append(1e6 * (d1 - d0) / fragments)
                row.wall_us.append(1e6 * (w1 - w0) / fragments)
                if progress is not None:
                    progress(f"round {r + 1}/{repeat}: {t}: evaluator {row.actor_cpu_us[-1]:,.0f} us, driver "
                             f"{row.driver_cpu_us[-1]:,.0f} us, wall {row.wall_us[-1]:,.0f} us per fragment")  # fmt: skip
    finally:
        for s in sets.values():
            s.stop()
        disconnect()
    return TransportTable(
        env_id=env_id, fragment=fragment, envs=envs, batch_kib=batch, weights_kib=weights, rows=list(rows.values()),
        conditions={"fragments_per_round": fragments, "repeat": repeat, "machine_cores": os.cpu_count() or 1,
                    "model": model.model_dump(mode="json")},
    )  # fmt: skip


def _pid(_: Any) -> int:
    return os.getpid()


def print_transport_table(table: TransportTable, *, console: Any = None) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(
        title=f"bench transport: one fragment of {table.fragment} steps x {table.envs} env(s) of {table.env_id} "
        f"({table.batch_kib:,.0f} KiB) with new weights ({table.weights_kib:,.0f} KiB), sampling taken out"
    )
    for col in ("transport", "evaluator CPU us", "driver CPU us", "wall us", "rounds (evaluator / driver / wall)"):
        t.add_column(col, justify="left" if col == "transport" else "right")
    for r in table.rows:
        rounds = "; ".join(
            f"{a:,.0f} / {d:,.0f} / {w:,.0f}"
            for a, d, w in zip(r.actor_cpu_us, r.driver_cpu_us, r.wall_us, strict=True)
        )
        t.add_row(r.transport, f"{r.median('actor_cpu_us'):,.0f}", f"{r.median('driver_cpu_us'):,.0f}",
                  f"{r.median('wall_us'):,.0f}", rounds)  # fmt: skip
    con = console or Console()
    con.print(t)
    con.print("medians over rounds; per fragment: the request with its weights, setting them, the batch to the driver")
