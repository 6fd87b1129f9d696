"""The run loop, ``train``: the seeds of one model, on one dataset or several, train as one ensemble
(``step.py``) in a loop of named parts (``TrainingRun``): the set-up, the step, at their periods the logging
to TensorBoard and the progress bar with its divergence check, the batched evaluation of every
member at once and atomic checkpoints (``dt_primal.files.checkpoint``), then the final evaluation.
SIGINT/SIGTERM stop it after a checkpoint, for an exact ``--resume`` (``resume.py``). Several processes or
GPUs train data-parallel under ``torchrun`` (``distributed.py``)."""

from __future__ import annotations

import dataclasses
import os
import time
import warnings
from pathlib import Path

import numpy as np
import torch.distributed as dist
from torch.utils.tensorboard import SummaryWriter
from tqdm import tqdm

from dt_primal.config import Config
from dt_primal.data import Trajectories
from dt_primal.errors import UserError, phase
from dt_primal.evaluation.policy import Policy
from dt_primal.evaluation.reports import headline, run_record, target_text
from dt_primal.evaluation.rollout import Recorder, evaluation_seeds, rollout
from dt_primal.evaluation.video import render, renderer
from dt_primal.files.checkpoint import (
    load_members,
    member_checkpoint,
    model_from_checkpoints,
    pending_evaluation,
    rng_state,
    save_checkpoints,
    set_rng_state,
)
from dt_primal.files.records import append_point, keep_curve, read_curve, write_record
from dt_primal.files.run_folder import CHECKPOINT, CURVE, RECORD, SEED_FOLDERS, member_name
from dt_primal.machine import resolve_device
from dt_primal.model.members import all_finite, member_state
from dt_primal.provenance import commit, provenance
from dt_primal.training.checks import check_seeds
from dt_primal.training.distributed import Interrupted, StopSignal, agreed_precision, check_batch_split
from dt_primal.training.ensemble import ensemble_members, fresh_model, model_config
from dt_primal.training.overlapped_eval import OverlappedEvaluation
from dt_primal.training.resume import check_same_dataset, check_steps_left, check_unchanged, resuming
from dt_primal.training.step import TrainStep


def train(
    cfg: Config,
    data: Trajectories | dict[str, Trajectories],
    resume: bool = False,
    seeds: list[int] | None = None,
    video: Path | None = None,
) -> list[dict] | None:
    """Train every (dataset, seed) as one ensemble, each member exactly as it would train alone:
    ``data`` one dataset (``cfg.dataset``) or several by name, ``seeds`` default ``cfg.seed`` alone.
    Members write into ``member_folders`` (OUT, OUT/seed_N, or OUT/DATASET/MODEL/seed_N); returns
    each member's final evaluation report (also written to its ``eval.json``). Under torchrun every
    process draws the same batches and trains on its share; rank 0 alone writes files and
    evaluates, and the other ranks return None. ``video``: the final evaluation's first episode of every member
    and target rendered into that folder (``dt_primal.evaluation.video``)."""
    run = TrainingRun(cfg, data, resume, seeds)
    with StopSignal(run.device) as stop:
        while run.step < run.cfg.steps:
            run.update()
            stopping = stop.requested()
            step, cfg = run.step, run.cfg
            evaluate = step % cfg.eval_every == 0 and step < cfg.steps
            save = step % cfg.checkpoint_every == 0 or step == cfg.steps or stopping
            if step % cfg.log_every == 0 or evaluate or save:  # so no checkpoint or evaluation of bad weights
                run.check_and_log()
            if evaluate and run.rank == 0:
                run.evaluate_and_record()
            if save and run.rank == 0:
                run.checkpoint()
            if stopping:
                run.stop(stop.signum)
    return run.finish(video)


class TrainingRun:
    """One training run: its members, their model and training step, the step reached, and where it
    records them (TensorBoard, evals.jsonl, the progress bar). Its methods are the parts of
    ``train``'s loop: set up (the constructor), ``update``, ``check_and_log``, ``evaluate_and_record``,
    ``checkpoint``, ``stop`` and ``finish``."""

    def __init__(
        self, cfg: Config, data: Trajectories | dict[str, Trajectories], resume: bool, seeds: list[int] | None
    ):
        self.rank, self.world = (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (0, 1)
        self.seeds = seeds or [cfg.seed]
        check_seeds(self.seeds)
        self.members = ensemble_members(cfg, data if isinstance(data, dict) else {cfg.dataset: data}, seeds)
        self.out, self.cfg = cfg.out, self.members[0].cfg
        self.device = resolve_device(self.cfg.device)
        self.code = commit()  # the code this run loads, whatever the checkout becomes while it trains
        check_batch_split(self.cfg.batch_size, self.world)
        ckpts = self._checkpoints(resuming([m.last for m in self.members], self.cfg, seeds, resume))
        self.cfg = dataclasses.replace(self.cfg, precision=agreed_precision(self.cfg, self.device, self.rank))
        for m in self.members:  # recorded resolved
            m.cfg = dataclasses.replace(m.cfg, precision=self.cfg.precision)
        self.step, self.saved_step = 0, None
        with phase("training"):
            self._build(ckpts)
        self.policy = self.acting_with(self.model)
        overlap = self.cfg.eval_overlap and self.rank == 0
        kernel = self.cfg.attention_kernel
        self.overlapped = OverlappedEvaluation(self.model, self.acting_with, self.device, kernel) if overlap else None
        self.names = [member_name(m.cfg.dataset, m.cfg.seed, len(self.parts) > 1) for m in self.members]
        self._open_records()
        self._evaluate_missing(ckpts)

    def acting_with(self, model, capture: bool = True) -> Policy:
        """The members' policy with ``model`` (the trained model, or a copy of its weights); ``capture``: as
        ``Policy``'s."""
        members, cfg = self.members, self.cfg
        mean, std = (np.stack([getattr(m, k) for m in members]) for k in ("state_mean", "state_std"))
        return Policy(model, mean, std, cfg.reward_scale, cfg.context, cfg.precision, capture=capture)

    @property
    def where(self) -> Path:
        """The members' checkpoints, as messages name them."""
        if len(self.members) == 1:
            return self.members[0].last
        seeds = SEED_FOLDERS if len(self.members) == len(self.seeds) else f"*/*/{SEED_FOLDERS}"
        return Path(self.out) / seeds / CHECKPOINT

    def _checkpoints(self, resuming: bool) -> list[dict] | None:
        """The members' checkpoints when the run continues from them (checked against the data and the
        options given), and each member's state normalisation: its checkpoint's, or its dataset's."""
        ckpts = load_members([m.last for m in self.members]) if resuming else None
        if ckpts is not None:
            lasts = [m.last for m in self.members]
            check_steps_left(ckpts[0]["step"], self.cfg.steps, lasts[0] if len(lasts) == 1 else Path(self.out))
        for i, m in enumerate(self.members):
            if ckpts is not None:
                check_same_dataset(ckpts[i], m.data, m.last)
                check_unchanged(Config(**ckpts[i]["config"]), m.cfg, m.last)
                m.state_mean, m.state_std = ckpts[i]["state_mean"], ckpts[i]["state_std"]
            else:
                m.state_mean, m.state_std = m.data.state_stats()
        return ckpts

    def _build(self, ckpts: list[dict] | None) -> None:
        """The model, the members' generators, the sampler and the training step, continued from
        ``ckpts`` when given. Each member as its seed alone: initialised and drawing batches from its
        seed; dropout draws from the process's generator. Under torchrun every rank seeds alike and
        draws the same batches and masks, so a checkpoint holds the state of all of them and
        --resume is exact with any number of processes."""
        cfg, members, device = self.cfg, self.members, self.device
        self.model = (
            model_from_checkpoints(ckpts, device)
            if ckpts
            else fresh_model(model_config(members[0]), [m.cfg.seed for m in members], device)
        )
        self.parts = list({m.index: m for m in members}.values())  # one member of each dataset
        self.trained_on = [m.data.best_episodes(cfg.top_percent) for m in self.parts]  # all of it, or %BC's part
        stats = [m.state_mean for m in self.parts], [m.state_std for m in self.parts]
        self.train_step = TrainStep.of_members(
            cfg,
            self.model,
            self.trained_on,
            *stats,
            [m.cfg.seed for m in members],
            device,
            rank=self.rank,
            world=self.world,
            capture=cfg.cuda_graph,
            datasets=[m.index for m in members],
        )
        self.gens = self.train_step.generators
        if ckpts is None:
            return
        try:
            self.train_step.load_state(ckpts[0]["step"], [c["optimizer"] for c in ckpts])
            for ckpt, gen in zip(ckpts, self.gens):
                set_rng_state(ckpt["rng"], gen)
        except (ValueError, KeyError, TypeError, RuntimeError) as exc:
            raise UserError(
                f"The training state in {members[0].last} is damaged ({type(exc).__name__}: {exc}); "
                f"evaluate it with evaluate.py, or start a new run with another --out."
            ) from exc
        self.step = self.saved_step = ckpts[0]["step"]
        print(f"resumed from {members[0].last if len(members) == 1 else self.out} at step {self.step}")

    def _evaluate_missing(self, ckpts: list[dict] | None) -> None:
        """A continued run first makes the intermediate evaluations its curve lacks, as it would have: the one that
        ran beside training when the run was killed or ended (of an earlier step, whose weights the checkpoint keeps),
        and the one of the checkpoint's own step (killed while it ran beside training, or a run ended there)."""
        if self.rank != 0 or ckpts is None:
            return
        pending = pending_evaluation(ckpts, self.where)
        missing = {pending[0]: pending[1]} if pending and pending[0] != self.step else {}
        if self.step % self.cfg.eval_every == 0 or pending and pending[0] == self.step:
            missing[self.step] = None  # the model's own weights
        made = {point["step"] for point in read_curve(self.curves[0])}
        for step, weights in missing.items():
            if step in made or not 0 < step < self.cfg.steps:
                continue
            if weights is None:
                self.evaluate_and_record()
                continue
            model = model_from_checkpoints([{**c, "model": w} for c, w in zip(ckpts, weights)], self.device)
            self._evaluate_in_line(self.acting_with(model, capture=False), step)

    def _open_records(self) -> None:
        """TensorBoard writers and evals.jsonl of every member (rank 0; an evaluation newer than the
        checkpoint the run continues from is dropped), and the progress bar."""
        self.writers, self.curves = [], [m.folder / CURVE for m in self.members]
        if self.rank == 0:
            for m, path in zip(self.members, self.curves):
                m.folder.mkdir(parents=True, exist_ok=True)
                keep_curve(path, self.step)
                self.writers.append(SummaryWriter(str(m.folder)))
        cfg = self.cfg
        if cfg.compile and self.rank == 0 and self.step < cfg.steps:
            print(
                "--compile: the first steps compile the members' loss (about 20-30 s on an H100, a minute or more "
                "on a CPU) before the progress bar moves"
            )
        self.t_log, self.n_log = time.perf_counter(), 0
        datasets = ", ".join(dict.fromkeys(m.cfg.dataset for m in self.members)) + " " if len(self.parts) > 1 else ""
        who = self.names[0] if len(self.names) == 1 else f"{datasets}seeds {' '.join(map(str, self.seeds))}"
        self.bar = tqdm(
            total=cfg.steps,
            initial=self.step,
            desc=f"{cfg.model} {who}",
            unit="step",
            mininterval=5,
            disable=self.rank != 0,
        )

    def update(self) -> None:
        """One training step of every member."""
        with phase("training"):
            self.train_step()
        if self.overlapped is not None:
            self.overlapped.pace()
        self.step += 1
        self.n_log += 1
        self.bar.update(1)

    def check_and_log(self) -> None:
        """The mean losses since the last log (over all processes): refused when a member's loss or
        weights are no longer finite, else written to TensorBoard and the progress bar."""
        sums = self.train_step.sums
        if self.world > 1:
            dist.all_reduce(sums)
            sums /= self.world
        sums_v = (sums / self.n_log).cpu().numpy()
        finite = np.isfinite(sums_v).all(1) & all_finite(self.model).cpu().numpy()
        if not finite.all():
            kept = (
                "no checkpoint was written"
                if self.saved_step is None
                else f"{self.where} keeps the weights of step {self.saved_step}"
            )
            bad = ", ".join(n for n, ok in zip(self.names, finite) if not ok)
            self.close()
            raise UserError(
                f"The loss became {sums_v[~finite][0, 0]} (or the weights non-finite) by step {self.step}"
                f"{'' if len(self.names) == 1 else f' for {bad}'}; training stopped and {kept}. "
                f"Start again with a lower --lr or --grad-clip, or --precision fp32, or check the "
                f"dataset for extreme values."
            )
        if self.rank == 0:
            self.log(sums_v, time.perf_counter() - self.t_log)
        sums.zero_()
        self.t_log, self.n_log = time.perf_counter(), 0

    def log(self, sums: np.ndarray, seconds: float) -> None:
        """Each member's losses, learning rate, speed and KSVD statistics (its Λ) to TensorBoard."""
        lam = [b.attn.Lambda.detach() for b in getattr(self.model, "blocks", ()) if hasattr(b.attn, "Lambda")]
        lr, step = float(self.train_step.lr), self.step
        for m, writer in enumerate(self.writers):
            loss_v, action_v, j2_v = sums[m]
            writer.add_scalar("loss/total", loss_v, step)
            writer.add_scalar("loss/action_mse", action_v, step)
            writer.add_scalar("perf/steps_per_s", self.n_log / seconds, step)
            writer.add_scalar("lr", lr, step)
            if lam:
                writer.add_scalar("ksvd/J_squared", j2_v, step)
                for k, values in enumerate(v[m] for v in lam):
                    writer.add_scalar(f"ksvd/lambda_mean/{k}", values.mean().item(), step)
                    writer.add_scalar(f"ksvd/lambda_abs_max/{k}", values.abs().max().item(), step)
        self.bar.set_postfix(loss=" ".join(f"{a:.4f}" for a in sums[:, 1]), ups=f"{self.n_log / seconds:.1f}")

    def evaluate(
        self,
        policy: Policy,
        episodes: int,
        recorder: Recorder | None = None,
        pipeline: bool | None = None,
        progress: bool = False,
    ) -> tuple[list[list[dict]], float]:
        """``episodes`` episodes per target of every member at once, acting with ``policy`` (``pipeline``, and
        ``progress``, a progress bar: as ``rollout``'s): per member, a report per target; and the seconds they took."""
        members, t0 = self.members, time.perf_counter()
        with phase("evaluation"):
            per_member = rollout(
                policy,
                [m.task for m in members],
                [m.targets for m in members],
                episodes,
                seeds=evaluation_seeds([m.cfg.seed for m in members]),
                recorder=recorder,
                pipeline=pipeline,
                progress=progress,
            )
        return per_member, time.perf_counter() - t0

    def evaluate_and_record(self) -> None:
        """The periodic evaluation of the weights of this step: beside training where evaluations overlap it
        (``--eval-overlap``; recorded by a later ``collect``), on CUDA once the step is a captured graph (no
        capture, and no eager step's process-wide TF32 switches, beside an evaluation); else here, at once."""
        self.collect()
        if self.overlapped is not None and (self.train_step.graph is not None or self.device.type == "cpu"):
            self.overlapped.start(self.model, self.step, self.periodic)
            return
        self._evaluate_in_line(self.policy, self.step)

    def periodic(self, policy: Policy) -> tuple[list[list[dict]], float]:
        """A periodic evaluation's episodes, acting and stepping in turn (not pipelined, ``rollout``), beside training
        or not, so that both give the same scores: beside training its forward passes wait on training's kernels, and
        halves would double their number."""
        return self.evaluate(policy, self.cfg.eval_episodes_during, pipeline=False)

    def _evaluate_in_line(self, policy: Policy, step: int) -> None:
        """The periodic evaluation of ``policy`` (the weights of ``step``) here, recorded at once."""
        self.record(step, *self.periodic(policy), overlapped=False)

    def collect(self) -> None:
        """Record the evaluation that runs beside training, once it has ended (if one runs). Should it fail (a
        RuntimeError, such as a CUDA error of its thread), it runs again here on its copy of the weights, with a
        warning, and so do the later evaluations."""
        try:
            done = self.overlapped.collect() if self.overlapped is not None else None
        except RuntimeError as exc:
            failed, self.overlapped = self.overlapped, None
            warnings.warn(
                f"an evaluation beside training failed ({type(exc).__name__}: {str(exc)[:200]}); it runs again "
                f"in line, and so do the later ones",
                RuntimeWarning,
                stacklevel=2,
            )
            self._evaluate_in_line(failed.policy, failed.step)
            return
        if done is not None:
            self.record(*done, overlapped=True)

    def record(self, step: int, per_member: list[list[dict]], seconds: float, overlapped: bool) -> None:
        """An evaluation's scores to TensorBoard, evals.jsonl (with its seconds and whether it ran beside
        training) and the progress bar."""
        for writer, path, reports in zip(self.writers, self.curves, per_member):
            log_scores(writer, reports, step)
            append_point(path, step, reports, seconds, overlapped)
        self.bar.write(
            f"step {step}: "
            + "; ".join(
                f"{name}: " + ", ".join(f"target {target_text(r['target'])} -> {headline(r)}" for r in reports)
                for name, reports in zip(self.names, per_member)
            )
        )

    def checkpoint(self) -> None:
        """Every member's last.pt, written atomically, with the weights of an evaluation running beside training
        (recorded later: a run killed before then makes it again when continued)."""
        running = self.overlapped.running() if self.overlapped is not None else None
        save_checkpoints(
            [m.last for m in self.members],
            [
                member_checkpoint(
                    model=member_state(self.model, i),
                    optimizer=self.train_step.member_optimizer_state(i),
                    step=self.step,
                    rng=rng_state(self.gens[i]),
                    config=m.cfg,
                    task=m.task,
                    state_mean=m.state_mean,
                    state_std=m.state_std,
                    dataset=m.data.source,
                    model_config=model_config(m),
                    pending=None if running is None else (running, member_state(self.overlapped.copy, i)),
                )
                for i, m in enumerate(self.members)
            ],
        )
        self.saved_step = self.step

    def stop(self, signum: int) -> None:
        """After a SIGINT or SIGTERM: every process stops once rank 0 has written the checkpoint."""
        self.close()
        if self.world > 1:
            dist.barrier()  # until rank 0 has written the checkpoint
        raise Interrupted(signum, self.step, self.where)

    def close(self) -> None:
        self.collect()
        self.bar.close()
        for writer in self.writers:
            writer.close()

    def finish(self, video: Path | None = None) -> list[dict] | None:
        """The final evaluation of every member, written to its eval.json (rank 0; the others return None), its
        first episodes rendered into ``video``."""
        self.collect()
        self.bar.close()
        if self.rank != 0:
            return None
        if not self.members[0].last.exists():  # zero steps asked for: still leave a checkpoint to evaluate
            self.checkpoint()
        chosen = renderer(self.members[0].task) if video else None  # before the evaluation's clock starts
        recorder = Recorder(1) if chosen else None
        per_member, seconds = self.evaluate(self.policy, self.cfg.eval_episodes, recorder, progress=True)
        if recorder is not None:
            render([m.task for m in self.members], recorder.recorded(), per_member, self.names, video, chosen)
        results, made = [], provenance(self.device, self.code)
        for writer, m, reports in zip(self.writers, self.members, per_member):
            log_scores(writer, reports, self.step)
            writer.close()
            # the checkpoint relative to --out: the record names no machine path
            result = run_record(
                os.path.relpath(m.last, self.out),
                self.step,
                m.task.gym_id,
                m.data.source,
                dataclasses.asdict(m.cfg),
                reports,
                made,
                ensemble=self.seeds,
                eval_seconds=seconds,
                trained_on=trained_on(m.data, self.trained_on[m.index], self.cfg.top_percent),
            )
            write_record(m.folder / RECORD, result)
            results.append(result)
        return results


def trained_on(data: Trajectories, kept: Trajectories, percent: float) -> dict:
    """What of ``data`` a member trained on (``kept``, its best episodes holding ``percent`` % of the steps),
    as its record says it."""
    return {
        "top_percent": percent,
        "episodes": len(kept.lengths),
        "steps": len(kept.rewards),
        "of_episodes": len(data.lengths),
        "of_steps": len(data.rewards),
    }


def log_scores(writer: SummaryWriter, reports: list[dict], step: int) -> None:
    """An evaluation's mean return and normalised score per target, as TensorBoard scalars."""
    for r in reports:
        suffix = "" if r["target"] is None else f"_{r['target']:g}"
        if r["normalized_mean"] is not None:
            writer.add_scalar(f"eval/normalized{suffix}", r["normalized_mean"], step)
        writer.add_scalar(f"eval/return{suffix}", r["return_mean"], step)
