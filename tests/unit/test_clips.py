"""core/clips.py on real MinAtar Breakout: one episode's frames, and the GIF they make."""

from __future__ import annotations

import io

import numpy as np
from PIL import GifImagePlugin, Image

from crossrl.core.clips import FPS, MAX_BYTES, MINATAR_SCALE, encode_clip, record_episode
from crossrl.scenarios.spec import EnvSpec

SPEC = EnvSpec(id="MinAtar/Breakout-v1")


def _random_act(seed: int):  # type: ignore[no-untyped-def]
    rng = np.random.default_rng(seed)
    seen: list[np.ndarray] = []

    def act(obs: np.ndarray) -> int:
        seen.append(obs)
        return int(rng.integers(0, 3))

    return act, seen


def test_one_episode_of_minatar_breakout_as_a_gif() -> None:
    act, seen = _random_act(0)
    rec = record_episode(SPEC, act, seed=3, max_frames=400)
    assert rec.ended and 1 <= rec.length < 399  # a random paddle loses the ball well before 400 steps
    assert len(rec.frames) == rec.length + 1 == len(seen) + 1  # the reset's frame, then one per step
    assert rec.score >= 0 and rec.fps == FPS["minatar"]
    for f in rec.frames:
        assert f.dtype == np.uint8 and f.shape == (10 * MINATAR_SCALE, 10 * MINATAR_SCALE, 3)
    assert all(o.dtype == np.uint8 and o.shape == (10, 10, 4) for o in seen)  # the policy sees make_env's frames
    assert len({f.tobytes() for f in rec.frames}) > 1

    data = encode_clip(rec.frames, rec.fps)
    assert 0 < len(data) < MAX_BYTES
    gif = Image.open(io.BytesIO(data))
    assert isinstance(gif, GifImagePlugin.GifImageFile) and gif.is_animated
    assert gif.size == (160, 160)
    durations = []
    for i in range(gif.n_frames):
        gif.seek(i)
        durations.append(gif.info["duration"])
    # Breakout's ball moves every step, so no two consecutive frames are the same and none is merged.
    assert gif.n_frames == len(rec.frames)
    assert sum(durations) == len(rec.frames) * round(1000 / rec.fps)


def test_same_seed_same_actions_same_episode_and_the_frame_cap() -> None:
    a = record_episode(SPEC, lambda obs: 1, seed=5)
    b = record_episode(SPEC, lambda obs: 1, seed=5)
    assert (a.score, a.length) == (b.score, b.length)
    assert all(np.array_equal(x, y) for x, y in zip(a.frames, b.frames, strict=True))
    cut = record_episode(SPEC, lambda obs: 1, seed=5, max_frames=4)
    assert len(cut.frames) == 4 and cut.length == 3 and not cut.ended


def test_a_clip_over_the_size_limit_is_downscaled() -> None:
    rng = np.random.default_rng(0)
    frames = [rng.integers(0, 256, (160, 160, 3), dtype=np.uint8) for _ in range(20)]  # noise: no compression
    full = encode_clip(frames, 10, max_bytes=10**9)
    small = encode_clip(frames, 10, max_bytes=len(full) // 2)
    assert len(small) <= len(full) // 2
    assert Image.open(io.BytesIO(small)).size == (80, 80)
