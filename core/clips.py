"""A short clip of a policy playing one episode of a pixel env, so a reader sees what a score means.

:func:`record_episode` plays one episode of the env exactly as :func:`crossrl.core.envs.make_env` builds it
(the policy sees the preprocessed frames every engine trains on), from ``reset(seed=seed)``, and keeps what a
person would see: ALE's screen (``render_mode="rgb_array"``: the last emulator frame of each 4-frame step,
uint8 [210, 160, 3]) or MinAtar's grid (its ``rgb_array`` is float [10, 10, 3] in [0, 1]: made uint8 and scaled
up x16, nearest). :func:`encode_clip` makes an animated GIF of it (every browser shows one inline).
"""

from __future__ import annotations

import io
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from crossrl.core.envs import make_env
from crossrl.scenarios.spec import EnvSpec

MAX_FRAMES = 400
MAX_BYTES = 500_000  # what encode_clip keeps a clip under, downscaling when it must
MINATAR_SCALE = 16  # MinAtar's 10x10 grid as 160x160 pixels
# Clip frame rates: an ALE step is 4 emulator frames (60 Hz), so 15 steps/s is real time; MinAtar has no clock.
FPS = {"atari": 15, "minatar": 10}
CLIP_FORMAT = "gif"


@dataclass(frozen=True)
class Recording:
    """One episode as shown: ``frames`` (uint8 RGB [H, W, 3], the reset's first), its raw score and length in env
    steps; ``ended`` is False when ``max_frames`` cut it short."""

    frames: list[np.ndarray]
    score: float
    length: int
    ended: bool
    fps: int


def record_episode(
    env_spec: EnvSpec, act: Callable[[np.ndarray], Any], *, seed: int, max_frames: int = MAX_FRAMES
) -> Recording:
    """Play one episode of ``make_env(env_spec)`` (without the simulated step latency) from ``reset(seed=seed)``,
    calling ``act(obs) -> action`` on each preprocessed observation, until it ends or ``max_frames`` frames are
    kept (the reset's and one per step). The score is the sum of the env's raw rewards (make_env clips none)."""
    kind = env_spec.resolved_preprocessing
    if kind not in FPS or env_spec.multi_agent:
        raise ValueError(f"clips need a single-agent pixel env (atari or minatar preprocessing), not {env_spec.id!r}")
    if max_frames < 1:
        raise ValueError(f"max_frames must be >= 1, got {max_frames}")
    env = make_env(env_spec.model_copy(update={"step_latency_ms": 0.0}), render_mode="rgb_array")
    try:
        obs, _ = env.reset(seed=seed)
        frames = [_screen(env, kind)]
        score, length, ended = 0.0, 0, False
        while len(frames) < max_frames:
            obs, reward, terminated, truncated, _ = env.step(act(obs))
            score += float(reward)
            length += 1
            frames.append(_screen(env, kind))
            if terminated or truncated:
                ended = True
                break
        return Recording(frames=frames, score=score, length=length, ended=ended, fps=FPS[kind])
    finally:
        env.close()


def _screen(env: Any, kind: str) -> np.ndarray:
    frame = np.asarray(env.unwrapped.render())
    if kind == "minatar":  # float RGB [10, 10, 3] in [0, 1] (seaborn's cubehelix palette)
        frame = np.round(frame * 255).astype(np.uint8)
        frame = frame.repeat(MINATAR_SCALE, axis=0).repeat(MINATAR_SCALE, axis=1)
    if frame.dtype != np.uint8 or frame.ndim != 3 or frame.shape[-1] != 3:
        raise ValueError(f"render() gave {frame.dtype} {frame.shape}, not uint8 RGB [H, W, 3]")
    return frame


def encode_clip(frames: Sequence[np.ndarray], fps: int, *, max_bytes: int = MAX_BYTES) -> bytes:
    """``frames`` (uint8 RGB [H, W, 3]) as an animated GIF at ``fps``, looping, each frame on a 256-colour
    palette (the games use a few colours). Halved in size (nearest) until it fits in ``max_bytes``.

    Pillow's GIF writer merges consecutive identical frames into one longer frame (the duration is kept), so
    the file may hold fewer frames than given; the total duration is ``len(frames) / fps`` either way.
    """
    from PIL import Image

    if not frames:
        raise ValueError("no frames to encode")
    step = 1
    while True:
        images = [Image.fromarray(np.ascontiguousarray(f[::step, ::step])) for f in frames]
        buf = io.BytesIO()
        images[0].save(buf, format="GIF", save_all=True, append_images=images[1:], duration=round(1000 / fps), loop=0)
        data = buf.getvalue()
        if len(data) <= max_bytes or min(frames[0].shape[:2]) // (2 * step) < 16:
            return data
        step *= 2
