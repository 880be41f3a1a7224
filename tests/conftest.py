"""Test-wide isolation: every output (Ray's ~/.ray and ~/ray_results, MLflow stores) goes to temp folders."""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

_HOME = Path(tempfile.mkdtemp(prefix="crossrl-test-home-"))
os.environ["HOME"] = str(_HOME)
os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
os.environ["MLFLOW_DISABLE_TELEMETRY"] = "true"
os.environ["DO_NOT_TRACK"] = "1"
os.environ.pop("MLFLOW_TRACKING_URI", None)


def pytest_unconfigure(config: pytest.Config) -> None:
    """The temp HOME goes with the session (Ray and MLflow clients have stopped by now)."""
    shutil.rmtree(_HOME, ignore_errors=True)


@pytest.fixture
def results_dir(tmp_path: Path) -> Path:
    """A fresh embedded-store folder for one test."""
    d = tmp_path / "crossrl-results"
    d.mkdir()
    return d


SUPPORT = Path(__file__).parent / "support"
sys.path.insert(0, str(SUPPORT))  # test helpers (browser driver, fault engine, crash env)


@pytest.fixture
def fault_engine(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """Registers the test-only fault engine (tests/support/fault_engine.py); returns its marker folder."""
    markers = tmp_path / "fault-markers"
    markers.mkdir()
    monkeypatch.syspath_prepend(str(SUPPORT))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(SUPPORT), os.environ.get("PYTHONPATH")])))
    monkeypatch.setenv("CROSSRL_EXTRA_ENGINES", "fault=fault_engine:FaultAdapter")
    monkeypatch.setenv("CROSSRL_FAULT_DIR", str(markers))
    return markers


@pytest.fixture(scope="session")
def mlflow_server(tmp_path_factory: pytest.TempPathFactory):  # -> Iterator[str]
    """A real `mlflow server` on a free loopback port with an sqlite backend in a temp folder."""
    from mlflow_server import MlflowServer

    server = MlflowServer(tmp_path_factory.mktemp("mlflow-server")).start()
    yield server.url
    server.stop()
