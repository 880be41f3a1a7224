"""A trial's checkpoints on disk: one folder per checkpoint, written atomically, checked before it is trusted.

Layout, under the run's checkpoint root (``<results>/checkpoints/<scenario>/<run key>/<trial>/``)::

    ckpt-000000123456/          the env step it was taken at, zero-padded (names sort by step)
        crossrl.json            what it is: trial, fingerprint, counters, training seconds, every file's size and sha256
        engine/                 the engine's own state, as its adapter wrote it (RLlib's save_to_path, torch.save, ...)
        driver_rng.pkl          the trial process's Python, NumPy and torch random states

A checkpoint is written into a temporary folder beside it, every file and folder fsynced, then renamed into place
(the rename is atomic on one file system), so a kill mid-write leaves a ``.tmp-*`` folder that is never read and is
removed by the next write. Before a checkpoint is restored its files are checked against ``crossrl.json`` (sizes and
sha256): a truncated or corrupted one is passed over for the one before it.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import pickle
import random
import shutil
import tarfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from crossrl.scenarios.spec import Trial

FORMAT = 1
META = "crossrl.json"
ENGINE_DIR = "engine"
RNG_FILE = "driver_rng.pkl"
PREFIX = "ckpt-"
TMP_PREFIX = ".tmp-"


class CheckpointError(Exception):
    """A checkpoint folder that cannot be trusted (missing, truncated, corrupted): the message says what is wrong."""


class CheckpointMismatch(Exception):
    """A good checkpoint of another spec (fingerprint) or another trial: never restored."""


@dataclass(frozen=True)
class Resumed:
    """Where a resumed trial continues from: what its adapter restores (``path``, the engine's folder) and the
    counters the sink continues from."""

    folder: Path
    env_steps_sampled: int
    env_steps_trained: int
    iterations: int
    episodes: int
    train_s: float
    engine_state: dict[str, Any]

    @property
    def path(self) -> Path:
        """The engine's own state, as its adapter's ``save`` wrote it."""
        return self.folder / ENGINE_DIR

    @classmethod
    def of(cls, folder: Path, meta: Mapping[str, Any]) -> Resumed:
        return cls(
            folder=folder,
            env_steps_sampled=int(meta["env_steps_sampled"]),
            env_steps_trained=int(meta["env_steps_trained"]),
            iterations=int(meta["iterations"]),
            episodes=int(meta["episodes"]),
            train_s=float(meta["train_s"]),
            engine_state=dict(meta.get("engine_state") or {}),
        )


def resume_seed(trial: Trial, resumed: Resumed | None) -> int:
    """The seed of a trial's sampling envs and workers: the trial's, or for a resumed trial one drawn from (trial seed,
    the checkpoint's env step) by NumPy's ``SeedSequence``. A resume then replays neither the env seeds of the trial's
    start (fresh workers would: measured on RLlib, the first episodes after a restore were those of iteration 1) nor
    those of an earlier resume, and two resumes from the same checkpoint get the same seeds. Below 2**31, with room
    for the engines' per-worker and per-env offsets."""
    if resumed is None:
        return trial.seed
    import numpy as np

    state = np.random.SeedSequence([trial.seed, resumed.env_steps_sampled]).generate_state(1)[0]
    return int(state >> 1)


def folder_name(step: int) -> str:
    return f"{PREFIX}{step:012d}"


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def rng_state() -> dict[str, Any]:
    import numpy as np
    import torch

    return {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}


def set_rng_state(state: Mapping[str, Any]) -> None:
    import numpy as np
    import torch

    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])


def seed_rngs(seed: int) -> None:
    """Python's, NumPy's and torch's global generators seeded from ``seed`` (a trial that continues another trial's
    checkpoint: Population Based Training's exploit)."""
    import numpy as np
    import torch

    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def write(
    root: Path, *, step: int, save: Callable[[Path], Mapping[str, Any] | None], meta: Mapping[str, Any]
) -> tuple[Path, int]:
    """A new checkpoint ``root/ckpt-<step>``: ``save(folder)`` writes the engine's state into an empty folder and may
    return a small JSON-able description of it; ``meta`` (trial, fingerprint, counters) goes beside it. Returns the
    folder and its size in bytes. An earlier checkpoint at the same step is replaced."""
    root.mkdir(parents=True, exist_ok=True)
    for stale in root.glob(f"{TMP_PREFIX}*"):  # a write killed half-way
        shutil.rmtree(stale, ignore_errors=True)
    tmp = root / f"{TMP_PREFIX}{folder_name(step)}-{os.getpid()}"
    (tmp / ENGINE_DIR).mkdir(parents=True)
    try:
        described = save(tmp / ENGINE_DIR)
        with open(tmp / RNG_FILE, "wb") as f:
            pickle.dump(rng_state(), f)
        files: dict[str, dict[str, Any]] = {}
        for path in sorted(tmp.rglob("*")):
            if path.is_file():
                _fsync(path)
                files[path.relative_to(tmp).as_posix()] = {"size": path.stat().st_size, "sha256": _sha256(path)}
        body = {
            **meta,
            "format": FORMAT,
            "env_step": step,
            "written_at": time.time(),
            "engine_state": dict(described or {}),
            "files": files,
        }
        (tmp / META).write_text(json.dumps(body, indent=1, default=str))
        _fsync(tmp / META)
        for d in sorted((p for p in tmp.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
            _fsync(d)
        _fsync(tmp)
        final = root / folder_name(step)
        if final.exists():
            shutil.rmtree(final)
        os.rename(tmp, final)
        _fsync(root)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return final, sum(f["size"] for f in files.values()) + (final / META).stat().st_size


def read_meta(folder: Path) -> dict[str, Any]:
    """The checkpoint's ``crossrl.json``, after checking every file it lists (size, then sha256)."""
    try:
        meta = json.loads((folder / META).read_text())
    except FileNotFoundError:
        raise CheckpointError(f"no {META} (a write that did not finish?)") from None
    except (OSError, ValueError) as e:
        raise CheckpointError(f"{META} is unreadable ({type(e).__name__}: {e})") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT or not isinstance(meta.get("files"), dict):
        raise CheckpointError(f"{META} is not a crossrl checkpoint of format {FORMAT}")
    for rel, want in meta["files"].items():
        path = folder / rel
        if not path.is_file():
            raise CheckpointError(f"{rel} is missing")
        size = path.stat().st_size
        if size != want["size"]:
            raise CheckpointError(f"{rel} has {size} bytes, {want['size']} were written (truncated?)")
        if _sha256(path) != want["sha256"]:
            raise CheckpointError(f"{rel} does not match its sha256 (corrupted)")
    return meta


def checkpoints(root: Path) -> list[Path]:
    """The checkpoint folders under ``root``, newest (largest env step) first."""
    if not root.is_dir():
        return []
    return sorted((p for p in root.iterdir() if p.is_dir() and p.name.startswith(PREFIX)), reverse=True)


def newest_good(
    root: Path, *, fingerprint: str, trial: str, warn: Callable[[str], None] = lambda _m: None
) -> tuple[Path, dict[str, Any]] | None:
    """The newest checkpoint under ``root`` whose files check out, or None; each one passed over is one ``warn`` line.
    Raises :class:`CheckpointMismatch` for a good checkpoint of another fingerprint or trial."""
    for folder in checkpoints(root):
        try:
            meta = read_meta(folder)
        except CheckpointError as e:
            warn(f"checkpoint {folder.name} cannot be used: {e}; trying the one before it")
            continue
        if meta.get("fingerprint") != fingerprint or meta.get("trial") != trial:
            raise CheckpointMismatch(
                f"checkpoint {folder} is of trial {meta.get('trial')!r} with spec fingerprint "
                f"{meta.get('fingerprint')}, not of {trial!r} with {fingerprint}: it was not written by this spec; "
                "resume with the spec that wrote it, or start a new run"
            )
        return folder, meta
    return None


def prune(root: Path, keep: int) -> list[Path]:
    """Removes all but the ``keep`` newest checkpoints under ``root``; returns those removed."""
    gone = checkpoints(root)[keep:]
    for folder in gone:
        with contextlib.suppress(OSError):
            shutil.rmtree(folder)
    return gone


def size_of(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def pack(folder: Path) -> bytes:
    """A checkpoint folder as one uncompressed tar (its files are mostly packed arrays already): what a trial on
    another node ships to the launcher, and the launcher to the node that resumes it."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        for path in sorted(folder.rglob("*")):
            tar.add(path, arcname=path.relative_to(folder).as_posix(), recursive=False)
    return out.getvalue()


def packed_meta(data: bytes) -> dict[str, Any]:
    """The ``crossrl.json`` of a packed checkpoint (not checked: :func:`unpack` checks it)."""
    with tarfile.open(fileobj=io.BytesIO(data), mode="r") as tar:
        member = tar.extractfile(META)
        if member is None:
            raise CheckpointError(f"no {META} in the packed checkpoint")
        return dict(json.loads(member.read()))


def unpack(root: Path, name: str, data: bytes) -> Path:
    """``data`` (from :func:`pack`) as the checkpoint ``root/name``, written as :func:`write` writes one (a
    temporary folder renamed into place) and checked against its ``crossrl.json`` before it is trusted; raises
    :class:`CheckpointError` for one that does not check out (nothing is left behind then)."""
    if not name.startswith(PREFIX) or "/" in name or name in (".", ".."):
        raise CheckpointError(f"{name!r} is not a checkpoint folder name")
    root.mkdir(parents=True, exist_ok=True)
    tmp = root / f"{TMP_PREFIX}{name}-{os.getpid()}-recv"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r") as tar:
            tar.extractall(tmp, filter="data")  # nothing outside the folder, no links out, no devices
        read_meta(tmp)
        for path in tmp.rglob("*"):
            if path.is_file():
                _fsync(path)
        _fsync(tmp)
        final = root / name
        if final.exists():
            shutil.rmtree(final)
        os.rename(tmp, final)
        _fsync(root)
    except BaseException as e:
        shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(e, (tarfile.TarError, OSError)):
            raise CheckpointError(f"checkpoint {name} could not be unpacked ({type(e).__name__}: {e})") from None
        raise
    return final
