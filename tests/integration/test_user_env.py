"""A user's own env, in a module of theirs outside the repository (`module:Id`): found from the current directory or
``CROSSRL_ENV_PATH`` by every command and in every process a run starts (trials, Ray workers, collectors), and when it
cannot be imported, the import error is said on one line (a near-miss registered name after it, never instead)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from crossrl.scenarios.loader import ENV_PATH_VAR, env_id_problem, user_import_path

CROSSRL = [sys.executable, "-c", "import sys; from crossrl.cli import main; sys.argv[0] = 'crossrl'; main()"]

REACH = '''
import gymnasium as gym
import numpy as np


class Reach(gym.Env):
    """Two numbers to push towards 1: action 1 earns a point, an episode lasts 20 steps."""

    def __init__(self):
        self.observation_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
        self.action_space = gym.spaces.Discrete(2)
        self.t = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.zeros(2, np.float32), {}

    def step(self, action):
        self.t += 1
        return np.full(2, 0.05 * self.t, np.float32), float(action), self.t >= 20, False, {}


gym.register("Reach-v0", entry_point=Reach)
'''


@pytest.fixture
def user_folder(tmp_path: Path) -> Path:
    """The user's folder, outside the repository, with their env module in it."""
    folder = tmp_path / "my-project"
    folder.mkdir()
    (folder / "reach.py").write_text(REACH)
    return folder


def _crossrl(
    *args: str, cwd: Path, env: dict[str, str] | None = None, timeout: float = 120
) -> subprocess.CompletedProcess:
    # run as the console script is (not `python -m`, which would put the current directory on the path by itself)
    clean = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", ENV_PATH_VAR)}
    return subprocess.run([*CROSSRL, *args], cwd=cwd, env={**clean, **(env or {})}, capture_output=True, text=True,
                          timeout=timeout)  # fmt: skip


def test_a_module_that_does_not_import_is_named_with_its_error_before_any_hint() -> None:
    line = env_id_problem({"id": "reach_nowhere:Reach-v0"}, "x.yaml")
    assert line is not None and "\n" not in line
    assert "module 'reach_nowhere' did not import (ModuleNotFoundError: No module named 'reach_nowhere')" in line
    assert ENV_PATH_VAR in line  # how to make it importable
    assert line.index("No module named") < line.index("did you mean Reacher")  # the near miss after, not instead


def test_the_current_directory_and_the_env_path_go_on_every_process_import_path(tmp_path: Path) -> None:
    environ = {"PYTHONPATH": "/already/there", ENV_PATH_VAR: f"{tmp_path / 'a'}{os.pathsep}{tmp_path / 'b'}"}
    added = user_import_path(environ, cwd=str(tmp_path))
    assert added == [str(tmp_path), str(tmp_path / "a"), str(tmp_path / "b")]
    assert environ["PYTHONPATH"].split(os.pathsep) == ["/already/there", *added]  # after what the user had
    assert all(folder in sys.path for folder in added)
    assert user_import_path(environ, cwd=str(tmp_path)) == []  # once only


@pytest.mark.integration
def test_init_validate_and_evaluate_find_the_users_module_or_say_in_one_line_why_not(user_folder: Path) -> None:
    init = _crossrl("init", "reach.yaml", "--env", "reach:Reach-v0", cwd=user_folder)
    assert init.returncode == 0, init.stderr
    ok = _crossrl("validate", "reach.yaml", cwd=user_folder)
    assert ok.returncode == 0, ok.stdout[-2000:] + ok.stderr[-2000:]
    elsewhere = user_folder.parent
    moved = _crossrl("validate", str(user_folder / "reach.yaml"), cwd=elsewhere)
    assert moved.returncode == 2 and len(moved.stderr.strip().splitlines()) == 1, moved.stderr
    assert "No module named 'reach'" in moved.stderr and "Traceback" not in moved.stderr
    found = _crossrl("validate", str(user_folder / "reach.yaml"), cwd=elsewhere, env={ENV_PATH_VAR: str(user_folder)})
    assert found.returncode == 0, found.stderr[-2000:]


@pytest.mark.system  # a run on every engine, about two minutes
def test_a_run_on_the_users_env_trains_on_every_engine_and_evaluate_elsewhere_says_why_not(user_folder: Path) -> None:
    """Run from the user's folder: every engine's processes (crossrl's evaluator actors, RLlib's env runners, TorchRL's
    collector workers) import the user's module. Evaluated from another folder: one line per trial naming the
    module, not a traceback."""
    assert _crossrl("init", "reach.yaml", "--env", "reach:Reach-v0", cwd=user_folder).returncode == 0
    results = user_folder / "results"
    args = ["--seeds", "0", "--workers", "1", "--steps", "400", "--results-dir", str(results)]
    run = _crossrl("run", "reach.yaml", *args, "--set", "algorithm.hyperparams.train_batch=256",
                   "--set", "algorithm.hyperparams.minibatch=128", cwd=user_folder, timeout=600)  # fmt: skip
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert run.stdout.count("FINISHED") >= 3, run.stdout[-3000:]
    assert (results / "reports" / "reach" / "report.html").is_file()  # the newcomer's walk reaches a report
    elsewhere = _crossrl("evaluate", "reach", "--episodes", "2", "--results-dir", str(results), cwd=user_folder.parent)
    lines = elsewhere.stderr.strip().splitlines()
    assert elsewhere.returncode == 2 and "Traceback" not in elsewhere.stderr, elsewhere.stderr[-3000:]
    assert len(lines) == 3 and all("No module named 'reach'" in line for line in lines), lines
    here = _crossrl("evaluate", "reach", "--episodes", "2", "--results-dir", str(results), cwd=user_folder)
    assert here.returncode == 0, here.stdout[-2000:] + here.stderr[-2000:]
