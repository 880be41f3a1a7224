"""Test-wide isolation: every output (Ray's ~/.ray and ~/ray_results, MLflow stores) goes to temp folders."""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

_HOME = Path(tempfile.mkdtemp(prefix="crossrl-test-home-"))
os.environ["HOME"] = str(_HOME)
os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
os.environ["MLFLOW_DISABLE_TELEMETRY"] = "true"
os.environ["DO_NOT_TRACK"] = "1"
os.environ.pop("MLFLOW_TRACKING_URI", None)


@pytest.hookimpl(trylast=True)  # after `-m` deselected what this session does not run
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests marked ``long`` (a minute or more on two cores; ``long(minutes)`` for the longest) go first, the longest
    first, alternately at the head of each half of the list: pytest-xdist's worksteal gives each of `make test`'s two
    workers a contiguous half and lets the idle one steal from the other's tail, so the long ones start at once on
    both workers instead of one worker running a five-minute search alone at the end."""

    def minutes(item: pytest.Item) -> float:
        mark = item.get_closest_marker("long")
        return float(mark.args[0]) if mark is not None and mark.args else 1.0

    long = sorted((item for item in items if item.get_closest_marker("long")), key=minutes, reverse=True)
    if not long:
        return
    short = [item for item in items if not item.get_closest_marker("long")]
    first, second = long[0::2], long[1::2]
    half = max(len(first), len(items) // 2)
    cut = half - len(first)
    items[:] = first + short[:cut] + second + short[cut:]


def pytest_unconfigure(config: pytest.Config) -> None:
    """A kept Ray (`ray_cluster`) stops, then the temp HOME goes with the session."""
    if "ray" in sys.modules:
        _kept_ray_down()
    shutil.rmtree(_HOME, ignore_errors=True)


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[None]:
    """A local Ray on 127.0.0.1 with 2 CPUs, kept up in this test process for the next module that asks for it too.

    Starting and stopping one costs 6-8 s here; the engines' adapters join a Ray that is already up (and leave it
    up), as they join a user's cluster. Each test that joins it finds every CPU free (`_ray_as_asked`). Modules opt in
    with ``pytestmark = pytest.mark.usefixtures("ray_cluster")``; a test among them that asks for `own_ray` runs with
    no Ray up (its engine starts its own), and a test that asks for neither runs without Ray, as it would alone.
    """
    _kept_ray_up()
    yield


@pytest.fixture
def own_ray() -> None:
    """In a module that keeps Ray up (`ray_cluster`): this test runs with none up, so its engine starts its own."""


@pytest.fixture(autouse=True)
def _ray_as_asked(request: pytest.FixtureRequest) -> None:
    """Before each test: a kept Ray with every CPU free for a test that asks for `ray_cluster` (one whose CPUs a test
    before left taken for 20 s is restarted), no Ray for any other."""
    wanted = "ray_cluster" in request.fixturenames and "own_ray" not in request.fixturenames
    if wanted:
        _kept_ray_up()
        from ray_state import cpus_free_again

        if not cpus_free_again(timeout_s=20.0):
            _kept_ray_down()
            _kept_ray_up()
    elif "ray" in sys.modules:
        _kept_ray_down()


def _kept_ray_up() -> None:
    import ray

    from crossrl.core import cluster

    if not ray.is_initialized():
        cluster.connect(None, num_cpus=2)


def _kept_ray_down() -> None:
    import ray

    from crossrl.core import cluster

    if ray.is_initialized():
        cluster.disconnect()


@pytest.fixture(scope="session")
def store_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An embedded store's sqlite file as crossrl's own first opening makes it (MLflow's schema, every migration:
    1.4-3.7 s here), made once per test process; `results_dir` copies it (0.02 s). The first opening itself is
    tested where it is the point: tests/faults/test_concurrency.py (three runs on one fresh store at once),
    tests/integration/test_store_server.py and every test that names a folder of its own."""
    from crossrl.reports.store import ResultsStore

    folder = tmp_path_factory.mktemp("store-template")
    ResultsStore(None, results_dir=folder).client.search_experiments()
    return folder / "mlflow.db"


@pytest.fixture
def results_dir(tmp_path: Path, store_template: Path) -> Path:
    """A fresh embedded-store folder for one test: an empty store, already migrated."""
    d = tmp_path / "crossrl-results"
    d.mkdir()
    shutil.copyfile(store_template, d / "mlflow.db")
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
