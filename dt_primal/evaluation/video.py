"""Rollout videos: evaluated episodes replayed and rendered offscreen, written as an MP4 and a PNG strip.

The episodes are the evaluated ones: ``rollout`` keeps their actions (``Recorder``), and each is replayed
here in a fresh environment of its task, reset with its evaluation seed and stepped with those actions,
so its frames show the very episode whose return the report gives (the replayed return is checked
against it). Rendering runs in a worker process of its own: MuJoCo's OpenGL backend is chosen there
(``MUJOCO_GL``: ``egl`` on GPU machines and with Mesa's software EGL, else ``osmesa``), and nothing of it
reaches the evaluating process. Frames are kept at about ``FPS`` per second of simulated time.
Needs imageio and imageio-ffmpeg (``pip install "dt-primal[video]"``).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import itertools
import multiprocessing
import os
import re
import sys
import time
from pathlib import Path

import numpy as np

from dt_primal.errors import UserError
from dt_primal.evaluation.reports import target_text
from dt_primal.files.writing import write_file, writing_by_name
from dt_primal.process import exit_with_parent
from envs import Task, quiet_mujoco_warnings

FPS = 30  # frames per second of simulated time
SIZE = (320, 240)  # width, height
BACKENDS = ("egl", "osmesa")  # headless OpenGL backends MuJoCo renders with, tried in this order
STRIP_FRAMES = 6  # frames of the PNG strip, evenly spaced over the episode
RUN_NAME_MAX = 120  # characters of a run's name in its clips' names, which must fit a file system's 255 bytes


def check_folder(folder: Path | None) -> None:
    """``--video DIR`` names a folder (or one that can be made), checked before any work that ends in writing into
    it: not a file, not a link to nothing, not under a file."""
    if folder is None:
        return
    if folder.is_symlink() and not folder.exists():
        raise UserError(f"--video {folder} is a link to nothing; give a folder for the videos.")
    if folder.exists() and not folder.is_dir():
        raise UserError(f"--video {folder} is a file; give a folder for the videos.")
    made = next(p for p in [folder, *folder.parents] if p.exists())  # the part of the path that exists
    if not made.is_dir():
        raise UserError(f"--video {folder} cannot be made: {made} is a file. Give a folder for the videos.")


def missing() -> str | None:
    """What video writing lacks here (a message), or None."""
    try:
        import imageio  # noqa: F401
        import imageio_ffmpeg  # noqa: F401
    except ImportError as exc:
        return f'writing videos needs imageio and imageio-ffmpeg ({exc}): pip install "dt-primal[video]"'
    return None


def replay(task: Task, seed: int, actions: np.ndarray, path: Path | None = None, size=SIZE) -> tuple:
    """In a worker process (``renderers``): the episode of ``task`` reset with ``seed`` and stepped with ``actions``,
    rendered at about ``FPS`` frames per simulated second, streamed into ``path``.mp4 with a strip of it in
    ``path``.png (None: nothing written); (its return, frames rendered, seconds per frame)."""
    quiet_mujoco_warnings()  # as the commands' own process (dt_primal.process)
    env = task.make(render_mode="rgb_array", width=size[0], height=size[1])
    try:
        env.reset(seed=seed)
        every = max(1, round(1 / (getattr(env.unwrapped, "dt", 1 / FPS) * FPS)))
        shown = [0] + [s for s in range(1, len(actions) + 1) if s % every == 0 or s == len(actions)]
        strip = set(np.linspace(0, len(shown) - 1, min(STRIP_FRAMES, len(shown))).round().astype(int).tolist())
        env.render()  # the first frame makes the renderer's camera
        total, kept, t0 = 0.0, [], time.perf_counter()
        with _writer(path) as mp4:
            for k, step in enumerate(shown):
                for action in actions[(shown[k - 1] if k else 0) : step]:
                    total += float(env.step(action)[1])
                frame = _frame(env)
                mp4.append_data(frame)
                if k in strip:
                    kept.append(frame)
        if path is not None:
            _imwrite(path, "png", np.concatenate(kept, axis=1))
        return total, len(shown), (time.perf_counter() - t0) / len(shown)
    finally:
        env.close()


class _Discard:
    """A writer that keeps nothing (a probe's frames)."""

    def append_data(self, frame: np.ndarray) -> None:
        pass


def named(path: Path, kind: str) -> Path:
    """``path``.``kind``: a clip's file (its name ends in a number, which is no suffix to replace)."""
    return path.with_name(f"{path.name}.{kind}")


@contextlib.contextmanager
def _writer(path: Path | None):
    """An MP4 writer for ``path``.mp4 (``append_data`` per frame), or one that keeps nothing: ffmpeg writes a new
    file beside the name, renamed over it once the clip is whole (``writing_by_name``: never through a link, never
    a partial clip under its name), and ends with the block."""
    if path is None:
        yield _Discard()
        return
    import imageio.v2 as imageio

    with (
        writing_by_name(named(path, "mp4"), "The video") as tmp,
        imageio.get_writer(tmp, format="FFMPEG", fps=FPS, macro_block_size=8) as mp4,
    ):
        yield mp4


def _imwrite(path: Path, kind: str, image: np.ndarray) -> Path:
    """``image`` as ``path``.``kind``, written beside it and renamed (``write_file``)."""
    import imageio.v2 as imageio

    write_file(named(path, kind), imageio.imwrite("<bytes>", image, format=kind), "The video strip")
    return named(path, kind)


def _frame(env) -> np.ndarray:
    """One frame, the camera looking at the body's root where the task's renderer has a free camera (MuJoCo's
    locomotion tasks: HalfCheetah's would otherwise stay where the run started while the body runs off)."""
    viewer = getattr(getattr(env.unwrapped, "mujoco_renderer", None), "viewer", None)
    data = getattr(env.unwrapped, "data", None)
    if viewer is not None and data is not None and len(data.xpos) > 1:
        viewer.cam.lookat[:2] = data.xpos[1][:2]
    return env.render()


def _probe(task: Task) -> bool:
    """In a worker process: whether MuJoCo renders a frame of ``task`` with the process's backend."""
    try:
        return replay(task, 0, np.zeros((0, 1)), None, (16, 16))[1] == 1
    except Exception:  # noqa: BLE001 (any failure to set up OpenGL means: not this backend)
        return False


def renderers(backend: str, workers: int = 1) -> concurrent.futures.ProcessPoolExecutor:
    """Fresh worker processes rendering with ``backend`` (``MUJOCO_GL``, read as MuJoCo loads: set in their
    environment as they start, never left in this process's), which end with this process, killed or not."""
    context = multiprocessing.get_context("spawn")
    pool = concurrent.futures.ProcessPoolExecutor(workers, mp_context=context, initializer=exit_with_parent)
    before = os.environ.get("MUJOCO_GL")
    os.environ["MUJOCO_GL"] = backend
    try:
        for job in [pool.submit(int) for _ in range(workers)]:  # start them all now, in this environment
            job.result()
    finally:
        if before is None:
            del os.environ["MUJOCO_GL"]
        else:
            os.environ["MUJOCO_GL"] = before
    return pool


def backend(task: Task) -> str | None:
    """The OpenGL backend that renders ``task`` here: ``MUJOCO_GL`` when set, else the first of ``BACKENDS``."""
    for name in [os.environ["MUJOCO_GL"]] if os.environ.get("MUJOCO_GL") else BACKENDS:
        with renderers(name) as pool:
            if pool.submit(_probe, task).result():
                return name
    return None


def file_name(run: str, episode: dict) -> str:
    """``RUN_target-T_seed-S_return-R[_score-N]``: the run, target, environment seed and what the episode scored."""
    run = re.sub(r"[^A-Za-z0-9_.-]+", "-", run).strip("-")[-RUN_NAME_MAX:] or "run"  # its end: the seed's folder
    score = "" if episode.get("score") is None else f"_score-{episode['score']:.1f}"
    return f"{run}_target-{target_text(episode['target'])}_seed-{episode['seed']}_return-{episode['return']:.1f}{score}"


def renderer(task: Task) -> str | None:
    """The backend to render ``task`` with (once per command, before its evaluation), or None after a note saying
    why videos cannot be written here."""
    problem = missing()
    chosen = None if problem else backend(task)
    if problem is None and chosen is None:
        problem = (
            "MuJoCo cannot render offscreen here: install Mesa's EGL (apt install libegl1 libgl1-mesa-dri) "
            "or OSMesa (apt install libosmesa6), or set MUJOCO_GL to a backend that works"
        )
    if problem:
        print(f"note: no video: {problem}", file=sys.stderr)
    return chosen


def render(
    tasks: Task | list[Task],
    recorded: list[dict],
    reports: list[list[dict]],
    runs: list[str],
    folder: Path,
    chosen: str,
) -> list[dict]:
    """The ``recorded`` episodes (``Recorder.recorded``) of members named ``runs``, of ``tasks`` (one, or one per
    member), whose per-member reports are ``reports``, rendered with the backend ``chosen`` (``renderer``) into
    ``folder``: per episode written its run, target, seed, return, score and ``path`` (the files are ``path``.mp4
    and ``path``.png); a clip whose name holds a folder is left out with a note, the evaluation's report unharmed."""
    tasks = tasks if isinstance(tasks, list) else [tasks] * len(runs)
    folder.mkdir(parents=True, exist_ok=True)
    episodes = []
    for e in recorded:
        report = next(r for r in reports[e["member"]] if r["target"] == e["target"])
        evaluated = float(report["returns"][e["episode"]])
        task = tasks[e["member"]]
        episode = dict(e, run=runs[e["member"]], task=task, score=task.normalize(evaluated), **{"return": evaluated})
        episodes.append(dict(episode, path=folder / file_name(episode["run"], episode)))
    filmed = []
    with renderers(chosen, min(os.cpu_count() or 1, len(episodes))) as pool:
        jobs = [pool.submit(replay, e["task"], e["seed"], e["actions"], e["path"]) for e in episodes]
        for e, job in zip(episodes, jobs):
            try:
                total, frames, per_frame = job.result()
            except UserError as exc:  # a folder at a clip's name, found only now: that clip alone is left out
                print(f"note: no video of {e['path'].name}: {exc}", file=sys.stderr)
                continue
            if not np.isclose(total, e["return"], rtol=1e-6, atol=1e-6):
                print(
                    f"note: the replayed episode returned {total:.3f}, the evaluated {e['return']:.3f}", file=sys.stderr
                )
            print(f"video: {e['path']}.mp4 ({frames} frames, {per_frame:.3f} s per frame, {chosen})")
            filmed.append({k: v for k, v in e.items() if k not in ("actions", "task")})
    return filmed


def side_by_side(episodes: list[dict], folder: Path) -> list[Path]:
    """For each target and episode rendered of several runs (``render``'s episodes), one clip of them side by
    side (shorter episodes hold their last frame) and their strips one above the other: ``folder``/
    ``side-by-side_target-T_episode-E``.mp4 and .png."""
    import imageio.v2 as imageio

    written = []
    for key in dict.fromkeys((e["target"], e["episode"]) for e in episodes):
        same = [e for e in episodes if (e["target"], e["episode"]) == key]
        if len(same) < 2:
            continue
        path = folder / f"side-by-side_target-{key[0]:g}_episode-{key[1]}"
        readers = [imageio.get_reader(named(e["path"], "mp4")) for e in same]
        last = [None] * len(readers)
        with _writer(path) as mp4:
            for frames in itertools.zip_longest(*readers):
                last = [f if f is not None else old for f, old in zip(frames, last)]
                mp4.append_data(np.concatenate(last, axis=1))
        for reader in readers:
            reader.close()
        strips = [imageio.imread(named(e["path"], "png")) for e in same]
        written += [named(path, "mp4"), _imwrite(path, "png", np.concatenate(strips, axis=0))]
        print(f"video: {written[-2]} ({', '.join(e['run'] for e in same)})")
    return written
