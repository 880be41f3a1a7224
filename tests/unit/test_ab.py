"""The A/B gate's parts without measuring: the paired ratio and its CI, the verdict, the requirement check
(on a clone of this repository with a commit that pins something else), and the base's checkout."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from crossrl.measure.bench.ab import (
    ABError,
    Cell,
    Measurement,
    Pair,
    checkout,
    child_module,
    repo_root,
    requirement_differences,
    resolve,
    stop_reason,
    verdict,
)
from crossrl.reports.regress import IMPROVED, OK, REGRESSION
from crossrl.reports.stats import PairedRatio, paired_ratio_ci

speeds = st.lists(st.floats(min_value=1e2, max_value=1e6), min_size=2, max_size=30)


@settings(max_examples=50, deadline=None)
@given(base=speeds, factor=st.floats(min_value=0.5, max_value=2.0))
def test_a_constant_factor_is_the_ratio_with_no_spread(base: list[float], factor: float) -> None:
    head = [b * factor for b in base]
    r = paired_ratio_ci(head, base, rng=np.random.default_rng(0))
    assert r.pairs == len(base)
    assert r.ratio == pytest.approx(factor, rel=1e-9)
    assert r.lo == pytest.approx(factor, rel=1e-9) and r.hi == pytest.approx(factor, rel=1e-9)


@settings(max_examples=50, deadline=None)
@given(base=speeds, noise=st.lists(st.floats(min_value=0.8, max_value=1.25), min_size=30, max_size=30))
def test_the_ratio_is_reciprocal_and_inside_its_ci(base: list[float], noise: list[float]) -> None:
    head = [b * n for b, n in zip(base, noise, strict=False)]
    forward = paired_ratio_ci(head, base, rng=np.random.default_rng(1))
    backward = paired_ratio_ci(base, head, rng=np.random.default_rng(1))
    assert forward.ratio * backward.ratio == pytest.approx(1.0)
    assert forward.lo <= forward.ratio * (1 + 1e-9) and forward.ratio <= forward.hi * (1 + 1e-9)
    # the pairs cancel what both sides shared: the machine's speed in each pair
    shifted = paired_ratio_ci([h * 3 for h in head[:1]] + head[1:], [b * 3 for b in base[:1]] + base[1:],
                              rng=np.random.default_rng(1))  # fmt: skip
    assert shifted.ratio == pytest.approx(forward.ratio)


def test_sessions_that_disagree_widen_the_ci() -> None:
    # six sessions of five pairs: each session off by its own few per cent, tight inside. Pairs alone would
    # count 30 independent values; resampling sessions first counts six, and the CI says so.
    rng = np.random.default_rng(0)
    offsets = np.repeat(1 + 0.03 * rng.standard_normal(6), 5)
    ratios = offsets * (1 + 0.003 * rng.standard_normal(30))
    base = np.full(30, 1000.0)
    flat = paired_ratio_ci(base * ratios, base, rng=np.random.default_rng(1))
    grouped = paired_ratio_ci(base * ratios, base, groups=np.repeat(np.arange(6), 5), rng=np.random.default_rng(1))
    assert grouped.ratio == flat.ratio
    assert grouped.hi - grouped.lo > 1.5 * (flat.hi - flat.lo)
    with pytest.raises(ValueError, match="group labels"):
        paired_ratio_ci(base, base, groups=[0, 1], rng=np.random.default_rng(0))


def test_paired_ratio_rejects_what_is_not_pairs() -> None:
    with pytest.raises(ValueError, match="not pairs"):
        paired_ratio_ci([1.0, 2.0], [1.0], rng=np.random.default_rng(0))
    with pytest.raises(ValueError, match="> 0"):
        paired_ratio_ci([1.0, 0.0], [1.0, 1.0], rng=np.random.default_rng(0))
    one = paired_ratio_ci([2.0], [1.0], rng=np.random.default_rng(0))
    assert one.ratio == 2.0 and math.isnan(one.lo) and math.isnan(one.hi)


def test_verdict_needs_the_whole_ci_past_the_line() -> None:
    assert verdict(PairedRatio(0.95, 0.94, 0.97, 8), 0.98) == REGRESSION
    assert verdict(PairedRatio(0.95, 0.90, 0.99, 8), 0.98) == OK  # the CI reaches over the line: not shown
    assert verdict(PairedRatio(1.05, 1.03, 1.07, 8), 0.98) == IMPROVED  # above 1 / 0.98
    assert verdict(PairedRatio(1.01, 1.00, 1.03, 8), 0.98) == OK
    assert verdict(PairedRatio(0.9, math.nan, math.nan, 8), 0.98) == OK  # one pair: no CI, no verdict


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@example.org", *args],
        check=True, capture_output=True, text=True,
    ).stdout  # fmt: skip


@pytest.fixture(scope="module")
def clone(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A clone of this repository whose HEAD pins another requirement set than HEAD~1."""
    src = repo_root()
    dest = tmp_path_factory.mktemp("ab") / "repo"
    subprocess.run(["git", "clone", "-q", str(src), str(dest)], check=True)
    with open(dest / "requirements.txt", "a") as f:
        f.write("six==1.16.0\n")
    _git(dest, "commit", "-q", "-am", "pin six")
    return dest


def test_other_requirements_are_refused(clone: Path) -> None:
    assert requirement_differences(clone, resolve(clone, "HEAD")) == []
    assert requirement_differences(clone, resolve(clone, "HEAD~1")) == ["requirements.txt"]
    text = (clone / "pyproject.toml").read_text()
    (clone / "pyproject.toml").write_text(text.replace("dependencies = [", 'dependencies = [\n    "six",', 1))
    try:
        assert requirement_differences(clone, resolve(clone, "HEAD")) == ["pyproject.toml dependencies"]
    finally:
        (clone / "pyproject.toml").write_text(text)


def test_an_unknown_revision_is_one_line(clone: Path) -> None:
    with pytest.raises(ABError, match="'no-such-rev' is not a commit") as e:
        resolve(clone, "no-such-rev")
    assert "\n" not in str(e.value)


def test_the_base_is_importable_as_crossrl_from_its_own_tree(clone: Path) -> None:
    base = resolve(clone, "HEAD~1")
    with checkout(clone, base) as path:
        assert "six" not in (path / "crossrl" / "requirements.txt").read_text()
        out = subprocess.run(
            [sys.executable, "-c", "import crossrl.measure.bench.samplers as s; print(s.__file__)"],
            env={"PYTHONPATH": str(path), "PATH": ""}, capture_output=True, text=True, check=True, cwd=path,
        ).stdout  # fmt: skip
        assert out.strip().startswith(str(path / "crossrl"))
    assert not path.exists()  # removed afterwards


def test_a_base_from_before_the_measure_package_runs_its_own_measurement_module(tmp_path: Path) -> None:
    """A base commit keeps its own layout: before the benchmarks moved to ``crossrl.measure`` its measurement process
    was ``crossrl.adapters.bench._child``; the installed side always runs this tree's."""
    (tmp_path / "crossrl" / "adapters" / "bench").mkdir(parents=True)
    (tmp_path / "crossrl" / "adapters" / "bench" / "_child.py").write_text("")
    assert child_module(tmp_path) == "crossrl.adapters.bench._child"
    (tmp_path / "crossrl" / "measure" / "bench").mkdir(parents=True)
    (tmp_path / "crossrl" / "measure" / "bench" / "_child.py").write_text("")
    assert child_module(tmp_path) == child_module(None) == "crossrl.measure.bench._child"


def _cell_with(pairs: int, lo: float, hi: float) -> Cell:
    m = Measurement(steps_per_s=1.0, steps_per_cpu_s=1.0, cpus=1.0)
    cell = Cell("crossrl", 1, pairs=[Pair(base=m, head=m, first="base", draw=i, process=0) for i in range(pairs)])
    cell.ratio = PairedRatio(ratio=1.0, lo=lo, hi=hi, pairs=pairs)
    return cell


def test_the_gate_stops_when_every_ci_is_narrow_enough_or_the_next_draw_would_pass_the_limit() -> None:
    narrow, wide = _cell_with(24, 0.99, 1.01), _cell_with(24, 0.9, 1.1)
    rule = {"precision": 0.015, "min_pairs": 24, "max_seconds": 100.0}
    assert stop_reason([narrow], **rule, elapsed_s=10, slowest_draw_s=5) == "every CI within +-1.5% after 24 pairs"
    assert stop_reason([narrow, wide], **rule, elapsed_s=10, slowest_draw_s=5) is None  # one CI still too wide
    assert stop_reason([_cell_with(23, 0.99, 1.01)], **rule, elapsed_s=10, slowest_draw_s=5) is None  # too few pairs
    late = stop_reason([narrow, wide], **rule, elapsed_s=96, slowest_draw_s=5)  # the next draw would end past 100 s
    assert late is not None and late.startswith("time limit 100 s: 24 pairs, the widest CI +-10.0%")
