"""Which engines' trials ran in a layout slower than the engine's fastest one measured for the same envs.

A trial's ``layout`` tag names how its engine stepped its envs (TorchRL's collector and batched env, RLlib's env
runners and vectorisation), in the words ``crossrl bench sampling --sweep`` names its layouts; the store keeps each
sweep's ``bench.json`` (:meth:`crossrl.reports.store.ResultsStore.layout_sweeps`). The report marks an engine's row
whose layout sampled below :data:`LAYOUT_SLACK` of that engine's fastest layout in the newest sweep of the same env
and total envs, among the sweep's layouts of the same batch (env steps per iteration, which the trial's algorithm
sets, not its layout): its speed figures then measure crossrl's choice of layout, not the engine at its best.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pandas as pd

LAYOUT_SLACK = 0.9
"""A layout counts as slower when its sweep median is below this share of the engine's fastest (the sweep's own
round-to-round spread is a few percent)."""


@dataclass(frozen=True)
class LayoutMark:
    """One engine x worker count's layout against the newest sweep of its env and total envs."""

    engine: str
    workers: int
    layout: str
    steps_per_s: float | None  # the layout's sweep median; None when the sweep did not time it
    best: str
    best_steps_per_s: float
    sweep_run: str
    sweep_start_ms: int

    @property
    def share(self) -> float | None:
        """This layout's sweep median over the engine's fastest."""
        return self.steps_per_s / self.best_steps_per_s if self.steps_per_s and self.best_steps_per_s else None

    @property
    def slower(self) -> bool:
        return self.share is not None and self.share < LAYOUT_SLACK

    def to_dict(self) -> dict[str, Any]:
        return {**self.__dict__, "share": self.share, "slower": self.slower}


def _median(point: Mapping[str, Any]) -> float | None:
    value = (point.get("steps_per_s") or {}).get("median")
    return float(value) if value else None


def _matches(label: str, layout: str) -> bool:
    """A sweep label (``MultiSync 2 x gym Sync(8), 4000 frames``) is a trial's layout (``MultiSync 2 x gym Sync(8)``)
    with the sweep's batch size after a comma."""
    return label == layout or label.startswith(layout + ",")


def _batch(label: str) -> str:
    """What a sweep label says after its layout: the env steps per iteration (``4000 frames``, ``fragment 250``)."""
    return label.partition(",")[2].strip()


def _timed(sweep: Mapping[str, Any], engine: str, total_envs: int) -> list[Mapping[str, Any]]:
    """The sweep's points that timed ``engine``, if the sweep stepped ``total_envs`` envs (else none)."""
    if int((sweep.get("conditions") or {}).get("total_envs") or -1) != total_envs:
        return []
    return [p for p in sweep.get("points", []) if p.get("engine") == engine and _median(p)]


def layout_marks(trials: pd.DataFrame, sweeps: Sequence[Mapping[str, Any]]) -> list[LayoutMark]:
    """Per engine and worker count whose trials name a layout, that layout against the newest stored sweep (``sweeps``
    newest first) of the same total envs that timed the engine; engines and counts without one are left out."""
    if trials.empty or "layout" not in trials or not sweeps:
        return []
    marks = []
    for (engine, workers), group in trials.groupby(["engine", "workers"], sort=True):
        named = group["layout"].fillna("").astype(str)
        named = named[named != ""]
        if named.empty:
            continue
        layout = str(named.mode().iloc[0])
        total = int(workers) * int(group["envs_per_worker"].iloc[0])
        for sweep in sweeps:
            timed = _timed(sweep, str(engine), total)
            if not timed:
                continue
            this = next((p for p in timed if _matches(str(p.get("label", "")), layout)), None)
            if this is not None:  # against layouts of the same batch: the trial's algorithm sets its batch size
                timed = [p for p in timed if _batch(str(p.get("label", ""))) == _batch(str(this.get("label", "")))]
            best = max(timed, key=lambda p: _median(p) or 0.0)
            marks.append(
                LayoutMark(
                    engine=str(engine),
                    workers=int(workers),
                    layout=layout,
                    steps_per_s=_median(this) if this else None,
                    best=str(best.get("label", "")),
                    best_steps_per_s=float(_median(best) or 0.0),
                    sweep_run=str(sweep.get("run_id", "")),
                    sweep_start_ms=int(sweep.get("start_time") or 0),
                )
            )
            break
    return marks


@dataclass(frozen=True)
class LayoutChoice:
    """The fastest of an engine's candidate layouts in the newest stored sweep of the same env and total envs."""

    engine: str
    workers: int
    value: str  # the layout knob's value that won (a TorchRL batched env, an RLlib vectorize mode)
    label: str  # that layout as the sweep named it
    steps_per_s: float  # its sweep median
    others: dict[str, float]  # each other candidate the sweep timed: its sweep median
    sweep_run: str
    sweep_start_ms: int


def fastest_layout(
    engine: str,
    *,
    workers: int,
    total_envs: int,
    candidates: Mapping[str, str],
    sweeps: Sequence[Mapping[str, Any]],
) -> LayoutChoice | None:
    """Of ``candidates`` (a layout knob's value -> the trial's layout label with it, e.g. ``SerialEnv`` ->
    ``MultiSync 2 x SerialEnv(4)``), the one the newest sweep (``sweeps`` newest first) of ``total_envs`` envs timed
    fastest for ``engine``, among that sweep's layouts at its main batch (its fixed layout's: other batches measure the
    batch, not the layout); None when no stored sweep timed any candidate."""
    for sweep in sweeps:
        timed = _timed(sweep, engine, total_envs)
        fixed = next((p for p in timed if p.get("fixed")), None)
        batch = _batch(str(fixed.get("label", ""))) if fixed else None
        found: dict[str, tuple[str, float]] = {}
        for value, layout in candidates.items():
            for point in timed:
                label = str(point.get("label", ""))
                if _matches(label, layout) and (batch is None or _batch(label) == batch):
                    found[value] = (label, float(_median(point) or 0.0))
                    break
        if not found:
            continue
        value = max(found, key=lambda v: found[v][1])
        return LayoutChoice(
            engine=engine,
            workers=workers,
            value=value,
            label=found[value][0],
            steps_per_s=found[value][1],
            others={v: rate for v, (_, rate) in found.items() if v != value},
            sweep_run=str(sweep.get("run_id", "")),
            sweep_start_ms=int(sweep.get("start_time") or 0),
        )
    return None
