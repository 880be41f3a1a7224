"""The report's verdict (reports/verdict.py): sentences that follow the numbers, and say when they mean nothing."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pandas as pd

from crossrl.reports import stats as S
from crossrl.reports.render import build_report
from crossrl.reports.verdict import DEFINITIONS, _final_return, verdict
from crossrl.scenarios import metrics as M


def _stats(make_frames: Any, **kwargs: Any) -> S.ReportStats:
    trials, points, _ = make_frames(n_points=15, **kwargs)
    return S.compute(trials=trials, points=points, rng=np.random.default_rng(0), grid_points=50)


def test_the_verdict_names_the_engine_each_table_ranks_first(make_frames: Any) -> None:
    st = _stats(make_frames, workers=(2,), seeds=(0, 1, 2, 3, 4), failures=False)
    lines = verdict(st)
    best_return = st.final_return.sort_values("iqm", ascending=False).iloc[0]["engine"]
    assert lines[0].startswith(f"Best final return: {best_return} (")
    fastest = st.throughput.sort_values("median", ascending=False)
    assert any(line.startswith(f"Fastest sampler: {fastest.iloc[0]['engine']}, ") for line in lines)
    ratio = fastest.iloc[0]["median"] / fastest.iloc[1]["median"]
    assert any(f"{ratio:.1f}x {fastest.iloc[1]['engine']}" in line for line in lines)
    reached = st.time_to_target[st.time_to_target["median_reached"]].sort_values("median_steps")
    if not reached.empty:
        assert any(
            line.startswith(f"Fastest to the target (450) in env steps: {reached.iloc[0]['engine']}") for line in lines
        )
    assert not any("no conclusion" in line for line in lines)  # five seeds


def test_one_seed_supports_no_conclusion(make_frames: Any) -> None:
    lines = verdict(_stats(make_frames, workers=(1,), seeds=(0,), failures=False))
    assert "one seed per engine: no conclusion" in lines[0]


def test_several_worker_counts_are_compared_apart_and_failures_are_counted(make_frames: Any) -> None:
    st = _stats(make_frames, workers=(1, 2), seeds=(0, 1, 2))
    lines = verdict(st)
    # at 1 worker the first engine kept 2 of its 3 seeds (one timed out): too few to name a winner
    [one] = [line for line in lines if line.startswith("1 worker: Final return: ")]
    assert one.startswith("1 worker: Final return: too few seeds to tell (2; a winner needs 3 per engine)"), one
    # at 2 workers one engine kept a single seed (the others failed): no winner is named
    [two] = [line for line in lines if line.startswith("2 workers: Final return: ")]
    assert "only one seed of" in two and "no conclusion" in two
    assert lines[-1].startswith(f"{len(st.problems)} trials did not finish")


def test_no_target_no_target_sentence_and_nothing_finished_says_so(make_frames: Any) -> None:
    lines = verdict(_stats(make_frames, workers=(1,), seeds=(0, 1), target=None, failures=False))
    assert not any("target" in line for line in lines)
    trials, points, _ = make_frames(n_points=10, seeds=(0,))
    trials["status"] = "FAILED"
    st = S.compute(trials=trials, points=points, rng=np.random.default_rng(0), grid_points=50)
    assert verdict(st)[0].startswith("No trial finished")


def test_the_report_opens_with_the_verdict_and_defines_its_measures(tmp_path: Path, make_frames: Any) -> None:
    trials, points, meta = make_frames(n_points=12, workers=(1,), seeds=(0,), failures=False)
    paths = build_report(trials=trials, points=points, meta=meta, out_dir=tmp_path)
    page, md = paths.html.read_text(), paths.markdown.read_text()
    assert page.index('id="verdict"') < page.index('id="table-final-return"')
    assert md.index("## Verdict") < md.index("## Final return")
    assert "supports no conclusion" in md and "no conclusion" in page
    for term, _ in DEFINITIONS:
        assert f"**{term}**" in md
    # report.md carries the figures as files beside it
    figures = sorted(p.name for p in (tmp_path / "figures").iterdir())
    assert figures and all(f"](figures/{name})" in md for name in figures)
    # the spec is shown with its defaults resolved, not as nulls
    assert "null" not in page.split("Spec (defaults resolved)")[1]


def _two_engines(make_frames: Any) -> S.ReportStats:
    return _stats(make_frames, engines=("crossrl", "torchrl"), workers=(1,), seeds=(0, 1, 2, 3, 4), failures=False)


def test_a_winner_is_named_only_when_the_printed_iqms_differ_and_the_ci_excludes_a_tie(make_frames: Any) -> None:
    st = _two_engines(make_frames)
    st.final_return["iqm"] = [0.94, 0.91]  # both print as 0.9
    st.improvement[["p", "ci_low", "ci_high"]] = [0.9, 0.7, 1.0]
    [line] = [x for x in verdict(st) if "final return" in x.lower()]
    assert line.startswith("Final return: no clear difference (IQM over seeds: crossrl 0.9, torchrl 0.9: equal"), line
    st.final_return["iqm"] = [12.0, 10.0]
    st.improvement[["p", "ci_low", "ci_high"]] = [0.7, 0.4, 0.9]  # the CI includes 0.5
    [line] = [x for x in verdict(st) if "final return" in x.lower()]
    assert line.startswith("Final return: no clear difference") and "the CI includes 0.5" in line, line
    st.improvement[["p", "ci_low", "ci_high"]] = [0.9, 0.7, 1.0]
    [line] = [x for x in verdict(st) if "final return" in x.lower()]
    assert line.startswith("Best final return: crossrl (IQM over seeds: crossrl 12.0, torchrl 10.0"), line


def test_every_fastest_to_line_gives_the_seeds_range_and_one_seed_names_no_winner(make_frames: Any) -> None:
    lines = verdict(_two_engines(make_frames))
    fastest = [line for line in lines if line.startswith("Fastest to the target")]
    assert len(fastest) == 2
    for line in fastest:
        assert "5/5 seeds: " in line and "-" in line.split("5/5 seeds: ")[1], line  # each engine's seeds' range
    one = verdict(_stats(make_frames, workers=(1,), seeds=(0,), failures=False))
    assert all("one seed of" in x and "no conclusion" in x for x in one if x.startswith("Fastest to the target"))
    assert not any(x.startswith("Best final return") for x in one)


def test_printed_numbers_never_read_minus_zero_and_a_greater_than_sign_stays_as_written() -> None:
    from crossrl.reports.render import md_cell
    from crossrl.reports.verdict import _num

    assert _num(-0.04) == "0.0" and _num(-0.06) == "-0.1" and _num(3.14159) == "3.1"
    assert md_cell("P(crossrl > rllib) = 0.9, <no async>") == "P(crossrl > rllib) = 0.9, &lt;no async>"


def test_the_return_at_equal_training_time_needs_two_engines_with_a_seed_in_it(
    tmp_path: Path, make_frames: Any
) -> None:
    trials, points, meta = make_frames(n_points=12, workers=(1,), seeds=(0, 1), failures=False)
    md = build_report(trials=trials, points=points, meta=meta, out_dir=tmp_path / "all").markdown.read_text()
    assert "## Return after" in md
    one = trials["engine"] == "crossrl"
    trials.loc[~one, "status"] = "FAILED"  # two of the three engines have no seed in it
    md = build_report(trials=trials, points=points, meta=meta, out_dir=tmp_path / "one").markdown.read_text()
    assert "## Return after" not in md


def test_an_engine_with_no_seed_at_equal_training_time_is_named_with_its_worker_count_in_words() -> None:
    import pandas as pd

    from crossrl.reports.verdict import missing_at_wall

    st: Any = SimpleNamespace(
        return_at_wall=pd.DataFrame(
            [{"engine": "rllib", "workers": 1, "n_seeds": 0}, {"engine": "torchrl", "workers": 2, "n_seeds": 0}]
        )  # fmt: skip
    )
    trials = pd.DataFrame([{"engine": "rllib", "workers": 1, "status": "FAILED"},
                           {"engine": "torchrl", "workers": 2, "status": "FAILED"}])  # fmt: skip
    assert missing_at_wall(st, trials) == [
        "rllib (1 worker): no seed: its trials ended FAILED",
        "torchrl (2 workers): no seed: its trials ended FAILED",
    ]


def _finals(finals: dict[str, list[float]]) -> S.ReportStats:
    """Stats whose final returns are exactly ``finals`` (engine -> one value per seed), through the real tables."""
    rows = [(e, s, v) for e, vs in finals.items() for s, v in enumerate(vs)]
    trials = pd.DataFrame(
        {"engine": [e for e, _, _ in rows], "workers": 1, "seed": [s for _, s, _ in rows], "status": "FINISHED"}
    )
    trials[M.FINAL_RETURN_MEAN] = [v for _, _, v in rows]
    rng = np.random.default_rng(0)
    counted = trials
    return SimpleNamespace(  # type: ignore[return-value]
        final_return=S.final_return_table(counted, rng=rng),
        improvement=S.improvement_table(counted, rng=rng),
        final_at_common=pd.DataFrame(),
        stop_at_target=False,
    )


def test_two_seeds_each_ahead_name_no_winner_and_say_why() -> None:
    """The degenerate certainty of a bootstrap over two seeds: both ahead gives a CI of [1.00, 1.00]."""
    st = _finals({"crossrl": [-12.0, -12.6], "torchrl": [-14.5, -15.1]})
    [row] = st.improvement.to_dict("records")
    assert row["ci_low"] == row["ci_high"] == 1.0  # what the bootstrap gives: not certainty
    line = _final_return(st, 1)
    assert line is not None and line.startswith("Final return: too few seeds to tell (2; a winner needs 3 per engine)")
    assert "Best" not in line


def test_a_zero_width_ci_names_a_winner_only_when_the_rank_test_does() -> None:
    three = _final_return(_finals({"crossrl": [10.0, 11.0, 12.0], "torchrl": [1.0, 2.0, 3.0]}), 1)
    assert three is not None and three.startswith("Final return: too few seeds to tell (3)"), three
    assert "rank test p = 0.100" in three
    five = _final_return(_finals({"crossrl": [10.0, 11.0, 12.0, 13.0, 14.0], "torchrl": [1.0, 2, 3, 4, 5]}), 1)
    assert five is not None and five.startswith("Best final return: crossrl ("), five
    assert "rank test p = 0.008" in five
    # spread that overlaps: a CI of some width that still excludes 0.5 names the winner as before
    mixed = _finals({"crossrl": [10.0, 12.0, 3.5, 11.0, 13.0], "torchrl": [1.0, 2.0, 4.0, 3.0, 5.0]})
    [row] = mixed.improvement.to_dict("records")
    line = _final_return(mixed, 1)
    assert line is not None
    if row["ci_low"] > 0.5 and row["ci_high"] > row["ci_low"]:
        assert line.startswith("Best final return: crossrl"), line


def test_the_final_return_says_trials_stopped_at_the_target_only_for_those_that_reached_it() -> None:
    """``budget.stop_at_target``: a trial that never reached the target ran its whole budget, so its final return is
    no "near the target by design" figure; the sentence counts the trials that did stop."""
    st = _finals({"crossrl": [100.0, 104.0, 101.0], "rllib": [20.0, 18.0, 22.0]})

    def with_reached(crossrl: int, rllib: int) -> str:
        ttt = pd.DataFrame({"engine": ["crossrl", "rllib"], "workers": 1, "n_seeds": 3, "n_reached": [crossrl, rllib]})
        line = _final_return(SimpleNamespace(**{**vars(st), "stop_at_target": True, "target_return": 100.0,
                                                "time_to_target": ttt}), 1)  # type: ignore[arg-type]  # fmt: skip
        assert line is not None
        return line

    assert "stopped" not in with_reached(0, 0)
    assert "the trials stopped on reaching the target (100)" in with_reached(3, 3)
    some = with_reached(3, 0)
    assert "the 3 of 6 trials that reached the target (100) stopped there" in some, some
    assert "the trials stopped on reaching" not in some
