"""The fidelity comparison's parts without an engine: which stored settings RLlib's own loop takes, and how the report
decides that the adapter and the engine's own loop differ beyond the noise."""

from __future__ import annotations

import math
import os
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from crossrl.measure.fidelity.rllib_loop import settings_from
from crossrl.reports.fidelity import STEPS_PER_S, FidelityData, markdown, table
from crossrl.scenarios import metrics as M


def test_rllib_loop_takes_the_settings_crossrl_chose_and_nothing_of_crossrls_own() -> None:
    defaults = {"lr": 5e-5, "num_epochs": 30, "env": None, "env_config": {}, "seed": None, "gamma": 0.99,
                "callbacks_on_episode_end": None, "policy_mapping_fn": object.__init__}  # fmt: skip
    stored = {"lr": 3e-4, "num_epochs": 10, "env": "crossrl-abc", "env_config": {"env_spec": {}}, "seed": 0,
              "gamma": 0.99, "callbacks_on_episode_end": "<function _on_episode_end at 0x7f00>",
              "policy_mapping_fn": repr(object.__init__), "not_in_rllib": 1}  # fmt: skip
    assert settings_from(stored, defaults) == {"lr": 3e-4, "num_epochs": 10, "seed": 0}


def test_rllib_loop_runs_sac_with_rllibs_own_critics_and_the_stored_settings() -> None:
    """The adapter's RLModule spec (its plain-MLP critics) is left for RLlib's default; the rest is taken."""
    from ray.rllib.algorithms.sac import SACConfig

    from crossrl.measure.fidelity.rllib_loop import SAC_REPLACED

    defaults = SACConfig().to_dict()
    stored = {
        **defaults,
        "training_intensity": 128.0,
        "num_steps_sampled_before_learning_starts": 5000,
        "_rl_module_spec": "RLModuleSpec(catalog_class=<class 'crossrl.adapters.rllib.sac.ConcatQCatalog'>)",
    }
    assert settings_from(stored, defaults, replaced=SAC_REPLACED) == {  # fmt: skip
        "training_intensity": 128.0,
        "num_steps_sampled_before_learning_starts": 5000,
    }
    with pytest.raises(ValueError, match="_rl_module_spec is an object"):
        settings_from(stored, defaults)


def test_rllib_loops_env_runners_beat_the_stall_watchdog_on_env_steps(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """RLlib's own loop beats the watchdog from its env runners per env step, not only once per ``train()``: one SAC
    iteration (1,000 env steps and as many updates) can outlast ``budget.stall_seconds`` on a loaded machine."""
    from ray.rllib.algorithms.sac import SACConfig

    from crossrl.core import envguard
    from crossrl.measure.fidelity import rllib_loop

    stored = {**SACConfig().to_dict(), "callbacks_on_episode_step": "<function _on_step at 0x1>", "gamma": 0.98}
    config, settings = rllib_loop.native_config("sac", stored, "Pendulum-v1", {})
    assert settings == {"gamma": 0.98} and config.env == "Pendulum-v1"
    assert config.callbacks_on_episode_step is rllib_loop._on_episode_step
    assert config.callbacks_on_episode_end is rllib_loop._on_episode_end
    monkeypatch.setenv(envguard.WATCH_DIR_ENV, str(tmp_path))
    monkeypatch.setattr(envguard, "_channel", None)
    monkeypatch.setattr(envguard, "_stacks_file", None)
    config.callbacks_on_episode_step(episode=None, env_runner=None, metrics_logger=None)
    assert (tmp_path / f"beat-{os.getpid()}").exists()


def test_rllib_loop_refuses_a_stored_object_it_cannot_rebuild() -> None:
    with pytest.raises(ValueError, match="rl_module_spec is an object"):
        settings_from({"rl_module_spec": "<RLModuleSpec object at 0x1>"}, {"rl_module_spec": None})


def _data(adapter: dict[str, list[float]], native: dict[str, list[float]]) -> FidelityData:
    rows = []
    for role, values in (("adapter", adapter), ("native", native)):
        for i in range(len(values[STEPS_PER_S])):
            rows.append({"role": role, "seed": i, "status": "FINISHED", "reason": "",
                         **{k: v[i] for k, v in values.items()}})  # fmt: skip
    return FidelityData("s", "rllib", "k", pd.DataFrame(rows), "parent", 450.0)


def _side(speed: float, rng: np.random.Generator) -> dict[str, list[float]]:
    return {
        M.STEPS_TO_TARGET: list(40_000 * rng.uniform(0.8, 1.2, 8)),
        M.FINAL_RETURN_MEAN: list(480 + rng.uniform(-10, 10, 8)),
        STEPS_PER_S: list(speed * rng.uniform(0.95, 1.05, 8)),
    }


def test_a_slower_adapter_is_flagged_and_equal_ones_are_within_the_noise() -> None:
    rng = np.random.default_rng(1)
    same = table(_data(_side(1000, rng), _side(1000, rng)))
    assert same.set_index("measure").within_noise.all()
    slow = table(_data(_side(600, rng), _side(1000, rng))).set_index("measure")
    assert slow.loc[STEPS_PER_S, "within_noise"] is False or not slow.loc[STEPS_PER_S, "within_noise"]
    assert slow.loc[STEPS_PER_S, "ratio_hi"] < 1 and slow.loc[STEPS_PER_S, "p_adapter_better"] == 0.0
    assert "adapter worse: find why" in markdown(_data(_side(600, rng), _side(1000, rng)))


def test_a_seed_that_missed_the_target_counts_as_worst_and_leaves_the_ratio() -> None:
    rng = np.random.default_rng(2)
    native = _side(1000, rng)
    adapter = {k: list(v) for k, v in native.items()}
    adapter[M.STEPS_TO_TARGET][0] = math.nan  # seed 0 never reached the target through the adapter
    row = table(_data(adapter, native)).set_index("measure").loc[M.STEPS_TO_TARGET]
    assert row.adapter_n == 7 and row.native_n == 8 and row.pairs == 7
    assert row.ratio == pytest.approx(1.0) and row.within_noise  # the 7 pairs are equal
    # the same values on both sides (P = 0.5) but one miss, which loses every comparison it is in
    assert row.p_adapter_better < 0.5


def test_rllib_loop_rebuilds_the_adapters_dreamer_config() -> None:
    """RLlib's own loop for a dreamer trial: a fresh ``DreamerV3Config`` takes the adapter's stored settings (model
    size, training ratio, the fragment that makes it) through JSON, and none of crossrl's objects."""
    import json

    from crossrl.adapters.rllib import adapter as R
    from crossrl.measure.fidelity import rllib_loop
    from crossrl.scenarios.loader import load

    trial = next(t for t in load("cartpole-dreamer")[0].trials() if t.engine == "rllib")
    built = R.build_config(trial, plan=R.ResourcePlan(1, 1.0, 0, ""), env_name="crossrl-registered")
    stored = json.loads(json.dumps(R.native_config(built), default=repr))
    config, settings = rllib_loop.native_config("dreamer", stored, "CartPole-v1", {})
    assert type(config).__name__ == "DreamerV3Config" and config.env == "CartPole-v1"
    assert settings["model_size"] == trial.hp("model_size") == config.model_size
    assert settings["training_ratio"] == trial.hp("training_ratio") == config.training_ratio
    assert config.rollout_fragment_length == built.rollout_fragment_length
    assert config.callbacks_on_episode_end is rllib_loop._on_episode_end
    assert "env" not in settings and "callbacks_on_episode_end" not in settings
