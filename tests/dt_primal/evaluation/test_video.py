"""Rollout videos: the rendered episodes are the evaluated ones, the evaluation is the same with or without
them, and a machine that cannot render says so and still evaluates."""

import json

import numpy as np
import pytest
from conftest import run

from dt_primal.evaluation import video
from envs import TASKS

pytest.importorskip("imageio_ffmpeg")


@pytest.fixture(scope="module")
def renders():
    """The offscreen OpenGL backend MuJoCo renders with here; the tests that render skip where there is none
    (CI machines without EGL or OSMesa: there the note of the test below is what a user sees)."""
    chosen = video.backend(TASKS["hopper"])
    if chosen is None:
        pytest.skip("no offscreen OpenGL backend (EGL, OSMesa) on this machine")
    return chosen


def evaluate(run_dir, out, *extra, env=None):
    res = run(
        "evaluate.py",
        str(run_dir / "last.pt"),
        "--episodes",
        "2",
        "--targets",
        "3600",
        "--device",
        "cpu",
        "--out",
        str(out),
        *extra,
        env=env,
    )
    assert res.returncode == 0, res.stderr
    return res, json.loads(out.read_text())


def test_the_video_shows_the_evaluated_episode_and_changes_no_score(run_dir, tmp_path, renders):
    _, plain = evaluate(run_dir, tmp_path / "plain.json")
    res, filmed = evaluate(run_dir, tmp_path / "filmed.json", "--video", str(tmp_path / "v"), "--video-episodes", "2")
    assert [c["targets"] for c in filmed["checkpoints"]] == [c["targets"] for c in plain["checkpoints"]]
    returns = plain["checkpoints"][0]["targets"][0]["returns"]
    clips = sorted((tmp_path / "v").glob("*.mp4"))
    assert len(clips) == 2 and len(list((tmp_path / "v").glob("*.png"))) == 2, res.stderr
    named = sorted(float(c.name.split("_return-")[1].split("_")[0].removesuffix(".mp4")) for c in clips)
    assert np.allclose(named, sorted(returns), atol=0.05)  # each file is one evaluated episode, by its return
    assert "replayed episode returned" not in res.stderr  # the replay gave the evaluated return
    import imageio.v2 as imageio

    frames = imageio.mimread(clips[0])
    assert frames[0].shape == (240, 320, 3) and np.ptp(frames[0]) > 0  # a picture, not a blank frame


def test_no_renderer_is_a_note_and_the_evaluation_still_runs(run_dir, tmp_path, monkeypatch, capsys):
    from dt_primal.cli.evaluate import evaluate_command

    monkeypatch.setattr(video, "backend", lambda task: None)  # as on a machine without EGL or OSMesa
    argv = [str(run_dir / "last.pt"), "--episodes", "1", "--device", "cpu", "--out", str(tmp_path / "r.json")]
    evaluate_command([*argv, "--video", str(tmp_path / "v")])
    err = capsys.readouterr().err
    assert "note: no video: MuJoCo cannot render offscreen here" in err and "apt install" in err
    assert json.loads((tmp_path / "r.json").read_text())["checkpoints"] and not (tmp_path / "v").exists()


@pytest.mark.parametrize("name", sorted(TASKS))
def test_a_few_frames_of_each_task_render_and_encode(name, tmp_path, renders):
    task = TASKS[name]
    with video.renderers(renders) as pool:
        actions = np.zeros((8, len(task.limits().low)))
        total, frames, _ = pool.submit(video.replay, task, 0, actions, tmp_path / "clip").result()
    import imageio.v2 as imageio

    clip = imageio.mimread(tmp_path / "clip.mp4")
    assert frames >= 2 and len(clip) == frames and clip[0].shape == (240, 320, 3) and np.isfinite(total)
    assert imageio.imread(tmp_path / "clip.png").shape[0] == 240


@pytest.mark.parametrize(
    "extra, phrase",
    [
        (["--video", "V", "--video-episodes", "3"], "--video-episodes must be between 1 and --episodes 2"),
        (["--side-by-side"], "--side-by-side puts rendered episodes side by side: give --video DIR too"),
        (["--video", "FILE"], "is a file; give a folder"),
    ],
)
def test_video_options_that_cannot_work_are_refused(run_dir, tmp_path, extra, phrase):
    from conftest import assert_user_error

    (tmp_path / "FILE").write_text("x")
    extra = [str(tmp_path / a) if a in ("V", "FILE") else a for a in extra]
    res = run("evaluate.py", str(run_dir / "last.pt"), "--episodes", "2", "--out", str(tmp_path / "r.json"), *extra)
    assert_user_error(res, phrase)


def test_two_checkpoints_side_by_side(run_dir, tmp_path, renders):
    ckpt = str(run_dir / "last.pt")  # the same checkpoint twice: two runs as far as the videos go
    args = ["--episodes", "1", "--targets", "3600", "--out", str(tmp_path / "r.json"), "--side-by-side"]
    res = run("evaluate.py", ckpt, ckpt, *args, "--video", str(tmp_path / "v"))
    clip = tmp_path / "v" / "side-by-side_target-3600_episode-0.mp4"
    import imageio.v2 as imageio

    assert imageio.mimread(clip)[0].shape == (240, 640, 3), res.stderr
    assert imageio.imread(clip.with_suffix(".png")).shape[0] == 480


def test_train_py_films_its_final_evaluation(tmp_path, renders):
    from conftest import QUICK, hopper_file

    out, folder = tmp_path / "run", tmp_path / "v"
    res = run(
        "train.py",
        "--dataset",
        str(hopper_file(tmp_path)),
        *QUICK,
        "--steps",
        "2",
        "--out",
        str(out),
        "--video",
        str(folder),
    )
    assert res.returncode == 0, res.stderr
    record = json.loads((out / "eval.json").read_text())
    clips = sorted(folder.glob("seed-0_target-*.mp4"))
    assert [c.name.split("_")[1] for c in clips] == sorted(f"target-{r['target']:g}" for r in record["targets"])


def test_a_sweep_films_its_best_and_worst_seed_side_by_side(run_dir, tmp_path, renders):
    import shutil

    from commands.sweep.clips import best_and_worst, film

    group = tmp_path / "sweep" / "tiny" / "primal"
    for seed in (0, 1, 2):
        shutil.copytree(run_dir, group / f"seed_{seed}")
    row = {"dataset": "tiny", "name": "primal", "dir": str(group), "finished_seeds": [0, 1, 2]}
    row["targets"] = [{"seeds": [20.0, 35.0, 5.0]}]
    assert best_and_worst(row) == [1, 2]
    (folder,) = film([row], tmp_path / "videos")
    assert len(list(folder.glob("side-by-side_target-*.mp4"))) == 2  # the run's two targets
    assert {p.name.split("_target-")[0] for p in folder.glob("*seed_*.mp4")} == {
        f"{str(group).strip('/').replace('/', '-')}-seed_{s}" for s in (1, 2)
    }


def test_train_py_refuses_a_video_folder_that_is_a_file_before_training(tmp_path):
    from conftest import QUICK, assert_user_error, hopper_file

    (tmp_path / "FILE").write_text("x")
    args = ["--dataset", str(hopper_file(tmp_path)), *QUICK, "--steps", "2", "--out", str(tmp_path / "run")]
    assert_user_error(run("train.py", *args, "--video", str(tmp_path / "FILE")), "is a file; give a folder")
    assert not (tmp_path / "run").exists()


def test_a_clip_replaces_a_link_or_fifo_at_its_name_and_refuses_a_folder(tmp_path, renders):
    """Clips and strips are written beside their names and renamed: a planted link is replaced, not written
    through; a FIFO is replaced, not waited on; a folder at the name is refused with a message, nothing left."""
    import os

    from dt_primal.errors import UserError

    task, actions = TASKS["hopper"], np.zeros((4, 3))
    outside = tmp_path / "outside.txt"
    outside.write_text("keep")
    (tmp_path / "clip.mp4").symlink_to(outside)
    os.mkfifo(tmp_path / "clip.png")
    with video.renderers(renders) as pool:
        pool.submit(video.replay, task, 0, actions, tmp_path / "clip").result(timeout=300)
        assert outside.read_text() == "keep"
        for name in ("clip.mp4", "clip.png"):
            assert (tmp_path / name).is_file() and not (tmp_path / name).is_symlink()
        assert sorted(p.name for p in tmp_path.iterdir()) == ["clip.mp4", "clip.png", "outside.txt"]  # no leftovers
        (tmp_path / "other.mp4").mkdir()
        with pytest.raises(UserError, match="is a folder"):
            pool.submit(video.replay, task, 0, actions, tmp_path / "other").result(timeout=300)
    assert not list(tmp_path.glob(".*tmp*"))


@pytest.mark.parametrize("kind", ["under a file", "dangling link"])
def test_a_video_folder_that_cannot_be_made_is_refused_before_the_evaluation(run_dir, tmp_path, kind):
    from conftest import assert_user_error

    (tmp_path / "FILE").write_text("x")
    (tmp_path / "gone").symlink_to(tmp_path / "nowhere")
    folder = tmp_path / "FILE" / "v" if kind == "under a file" else tmp_path / "gone"
    out = tmp_path / "r.json"
    res = run("evaluate.py", str(run_dir / "last.pt"), "--episodes", "2", "--out", str(out), "--video", str(folder))
    assert_user_error(res, "is a file" if kind == "under a file" else "link to nothing")
    assert not out.exists() and "evaluating" not in res.stderr


def test_a_folder_at_a_clips_name_leaves_that_clip_out_and_the_report_written(run_dir, tmp_path, renders):
    """A clip's name holds its return, so a folder there is found only once the episode is rendered: that clip
    is left out with a note, where it was a traceback after the whole evaluation, and no report."""
    folder = tmp_path / "v"
    evaluate(run_dir, tmp_path / "first.json", "--video", str(folder))
    (clip,) = folder.glob("*.mp4")
    for written in folder.iterdir():
        written.unlink()
    clip.mkdir()
    res, report = evaluate(run_dir, tmp_path / "again.json", "--video", str(folder))
    assert f"note: no video of {clip.name.removesuffix('.mp4')}" in res.stderr and "is a folder" in res.stderr
    assert report["checkpoints"] and clip.is_dir() and not list(folder.glob("*.png"))


def test_a_killed_evaluation_leaves_no_renderer_or_ffmpeg_behind(run_dir, tmp_path, renders):
    """A pool's idle renderer waited for work forever once its command was killed (and its ffmpeg with it):
    now every process the command started ends within seconds of it, and no clip is left under its name."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from conftest import ROOT, one_thread_env

    cmd = [sys.executable, "evaluate.py", str(run_dir / "last.pt"), "--episodes", "1", "--device", "cpu"]
    cmd += ["--out", str(tmp_path / "r.json"), "--video", str(tmp_path / "v")]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=one_thread_env(), start_new_session=True, stderr=subprocess.DEVNULL)
    deadline = time.time() + 240
    while proc.poll() is None and not list((tmp_path / "v").glob(".*.tmp.mp4")) and time.time() < deadline:
        time.sleep(0.05)  # until a clip is being written
    proc.kill()
    proc.wait()
    deadline = time.time() + 30
    while time.time() < deadline:
        try:
            os.killpg(proc.pid, 0)  # any process of the command's group still there
        except ProcessLookupError:
            break
        time.sleep(0.2)
    else:
        os.killpg(proc.pid, signal.SIGKILL)
        pytest.fail("processes of the killed command were still running 30 s later")
    clips = [p.name for p in (tmp_path / "v").glob("*.mp4") if not p.name.startswith(".")]
    assert not clips  # at most a hidden partial file, never a clip under its name
