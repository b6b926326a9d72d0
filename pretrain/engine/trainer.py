"""Pretraining on detectron2's engine: ``SimpleTrainer`` + hooks + writers + checkpointer."""

from __future__ import annotations

import contextlib
import logging
import math
import time
from collections.abc import Iterator, Sequence

import numpy as np
import torch
import yaml
from detectron2.engine import HookBase, SimpleTrainer, hooks
from detectron2.utils import comm
from detectron2.utils.events import get_event_storage
from fvcore.common.config import CfgNode
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import Dataset

from pretrain.config.defaults import ConfigError
from pretrain.config.resume import RESUME_FLAG, check_resume_config
from pretrain.config.step_policy import StepPolicy
from pretrain.config.world_size import resolve_world_size
from pretrain.data.datasets import build_source
from pretrain.data.loader import (
    augment_views_on_device,
    build_batch_augment,
    build_pretrain_loader,
    check_shared_memory,
)
from pretrain.data.prefetch import prefetch_to_device
from pretrain.engine.checkpoint import (
    AtomicCheckpointer,
    KeepRecentCheckpoints,
    check_last_checkpoint,
)
from pretrain.engine.config_changes import apply_config_changes, check_changed_schedule
from pretrain.engine.hooks import (
    BetaSchedule,
    MomentumUpdate,
    StopOnSignal,
    unwrap,
)
from pretrain.engine.launch import check_cpu_bfloat16, check_device, check_run_dir
from pretrain.engine.recompiles import RecompileWatch, compiled_graphs
from pretrain.engine.step_records import StepRecord, StepRecords
from pretrain.engine.writers import build_writers
from pretrain.evaluation.knn_monitor import build_knn_hook
from pretrain.modeling import build_model
from pretrain.solver.build import BetaParamScheduler, build_lr_scheduler, build_optimizer
from pretrain.utils.errors import LoracError
from pretrain.utils.locks import hold_for_lifetime
from pretrain.utils.rng_states import RngStates
from pretrain.utils.run_owner import PRETRAINING, record_owner
from pretrain.utils.run_setup import dump_run_info
from pretrain.utils.signals import default_stop_signals

__all__ = ["NonFiniteLossError", "PretrainTrainer", "schedule_lengths"]

logger = logging.getLogger(__name__)


def schedule_lengths(cfg: CfgNode, num_images: int) -> tuple[int, int, int]:
    """(iterations per epoch, max_iter, iterations with beta = inf) for ``num_images``."""
    ipe = num_images // cfg.SOLVER.IMS_PER_BATCH
    if ipe == 0:
        raise ConfigError(
            f"SOLVER.IMS_PER_BATCH = {cfg.SOLVER.IMS_PER_BATCH} exceeds the dataset size "
            f"({num_images} images at {cfg.DATASETS.ROOT!r})"
        )
    max_iter = cfg.SOLVER.MAX_ITER or int(round(cfg.SOLVER.EPOCHS * ipe))
    return ipe, max_iter, int(round(cfg.LOSS.BETA_INF_EPOCHS * ipe))


class NonFiniteLossError(ConfigError, FloatingPointError):
    """A non-finite loss (a diverging learning rate, say): a user error naming the last
    checkpoint."""


class _UserErrorWithoutTraceback(logging.Filter):
    """Drops the traceback detectron2's loop logs for a user error
    (:class:`~pretrain.utils.errors.LoracError`): the tool reports it as one ``error:`` line."""

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        if isinstance(error, LoracError):
            record.msg, record.args, record.exc_info = str(error), (), None
        return True


class PretrainTrainer(SimpleTrainer):
    """Builds everything from a config and runs ``run_step`` with autocast and a finite check.

    Each step augments the loader's uint8 views on the model's device and sums the model's
    ``loss_*`` outputs. Checkpoints hold the model (both encoders, queues), optimizer, scheduler,
    iteration, RNG states and the unreadable files met so far; data order and augmentation
    depend only on (SEED, iteration), so a resumed run continues exactly where it stopped.
    """

    def __init__(
        self,
        cfg: CfgNode,
        stop_on_interrupt: bool = False,
        resume_with_changes: bool = False,
        source: Dataset | None = None,
        log_to: Sequence[str] = (),  # the optional writers (pretrain/engine/writers.py)
    ) -> None:
        self.log_to = tuple(log_to)
        world = comm.get_world_size()
        # SOLVER.REFERENCE_WORLD_SIZE (a no-op on a config resolved already); checks the world size
        cfg = resolve_world_size(cfg, world)  # the rest was validated by load_config
        self.stop_on_interrupt = stop_on_interrupt  # Ctrl-C saves and stops (StopOnSignal)
        check_device(cfg.MODEL.DEVICE)
        check_cpu_bfloat16(cfg)
        check_run_dir(cfg.OUTPUT_DIR)  # another tool's run is left alone (demo, study, a job)
        self.cfg = cfg
        self.policy = StepPolicy.from_config(cfg)  # how the one step runs (eager or graph-safe)
        # before anything is written: a resume with another config is refused (resume_with_changes
        # allows a changed lr or schedule length, recorded in resume())
        self.config_changes = check_resume_config(cfg, resume_with_changes)
        check_last_checkpoint(cfg.OUTPUT_DIR)  # a truncated or missing one: before any write
        self.train_seconds = 0.0  # time spent in train() by pretrain.engine.run.run_pretraining
        # the data, scanned once (ImageNet has 1.28M files) and checked before anything is written
        self.source = build_source(cfg, "train") if source is None else source
        self.iters_per_epoch, max_iter, self.beta_inf_iters = schedule_lengths(
            cfg, len(self.source)
        )
        if comm.is_main_process():
            # one live run per OUTPUT_DIR, before anything is written there (pretrain/utils/locks)
            self.output_lock = hold_for_lifetime(self, cfg.OUTPUT_DIR)
            record_owner(cfg.OUTPUT_DIR, PRETRAINING)
            # with changes, config.yaml is replaced when they are recorded (resume())
            dump_run_info(cfg.OUTPUT_DIR, None if self.config_changes else cfg)
        if self.config_changes:  # before the hooks create their files
            check_changed_schedule(cfg.OUTPUT_DIR, max_iter)
        model = build_model(cfg, world, self.policy)
        optimizer = build_optimizer(cfg, model, self.policy)
        if world > 1:
            ids = [comm.get_local_rank()] if cfg.MODEL.DEVICE == "cuda" else None
            # no buffer broadcast in the forward: the queues are the same on every rank by
            # construction and each key encoder's BN statistics are its own (ShuffleBN)
            model = DistributedDataParallel(
                model, device_ids=ids, forward_sync_buffers=False, **self.policy.ddp
            )
        super().__init__(model, None, optimizer)
        amp = cfg.SOLVER.AMP
        self.amp_dtype = getattr(torch, amp.PRECISION) if amp.ENABLED else None
        self.device_type = cfg.MODEL.DEVICE
        self.color_augment = build_batch_augment(cfg, self.policy)
        # SOLVER.COMPILE: the forward and loss compiled whole (the beta switch compiles once
        # more), and the colour augmentation's masked form (~100 ops per resolution fused)
        compiled = self.policy.compile
        self._model_call = torch.compile(self.model, **compiled) if compiled else self.model
        augment = self.color_augment
        self._augment = torch.compile(augment.__call__, **compiled) if compiled else augment
        self._compiled_phases: set[bool] = set()  # the beta phases (prior on?) compiled so far
        # every recompile told in one line with its cause, when it starts (while train() runs)
        self._recompiles = RecompileWatch(self._announce_recompile)
        self._first_of_phase = False  # whether this step is its beta phase's first (compiled)
        logger.info(f"pretraining with the {self.policy.describe()}")
        # float16 needs loss scaling (bfloat16 does not); on the CPU too, where it is tested
        self.grad_scaler = (
            torch.amp.GradScaler(self.device_type) if self.amp_dtype == torch.float16 else None
        )
        self.scheduler = build_lr_scheduler(cfg, optimizer, max_iter, self.iters_per_epoch)
        self.checkpointer = AtomicCheckpointer(
            model,
            cfg.OUTPUT_DIR,
            save_to_disk=comm.is_main_process(),
            trainer=self,
        )
        self.start_iter, self.max_iter = 0, max_iter
        self._skipped: set[str] = set()
        # iterations not yet logged: their device values in a device ring buffer
        self._pending = StepRecords(cfg.SOLVER.LOG_PERIOD)
        self._first_bad = -1  # the first iteration with a non-finite loss (seen at a flush)
        self.register_hooks(self.build_hooks())

    # -- construction ----------------------------------------------------------------------
    def build_hooks(self) -> list[HookBase]:
        cfg = self.cfg
        ret = [
            hooks.IterationTimer(),
            hooks.LRScheduler(self.optimizer, self.scheduler),
            BetaSchedule(
                BetaParamScheduler(cfg.LOSS.BETA, self.beta_inf_iters, self.max_iter),
                self.max_iter,
            ),
            MomentumUpdate(),
        ]
        ret += self.extra_hooks()
        if comm.is_main_process():
            ret.append(
                KeepRecentCheckpoints(  # MAX_TO_KEEP over the run, resumes included
                    self.checkpointer,
                    cfg.SOLVER.CHECKPOINT_PERIOD,
                    self.max_iter,
                    cfg.SOLVER.MAX_TO_KEEP,
                )
            )
            config = yaml.safe_load(cfg.dump())
            writers = build_writers(cfg.OUTPUT_DIR, self.max_iter, self.log_to, config=config)
            ret.append(hooks.PeriodicWriter(writers, period=cfg.SOLVER.LOG_PERIOD))
        # on every rank: after a preemption/time-limit signal, save and stop (all ranks at the
        # same iteration boundary, checked in run_step); see pretrain/engine/hooks.py
        signals = default_stop_signals(interrupt=self.stop_on_interrupt)
        self.stop_on_signal = StopOnSignal(signals, agree_every=cfg.SOLVER.LOG_PERIOD)
        ret.append(self.stop_on_signal)
        return ret

    def extra_hooks(self) -> list[HookBase]:
        """Hooks added before checkpointing/writing (the kNN monitor, when configured)."""
        if self.cfg.TEST.KNN_PERIOD <= 0:
            return []
        return [build_knn_hook(self.cfg, self.model)]

    def resume(self) -> bool:
        """Resume from ``OUTPUT_DIR/last_checkpoint`` if present; returns whether it did."""
        if comm.is_main_process():
            for name in self.checkpointer.remove_stale_temporaries():
                logger.warning(f"removed {name}, a checkpoint write interrupted by a kill")
        resumed = self.checkpointer.has_checkpoint()
        if resumed:
            self.checkpointer.resume_or_load("", resume=True)
            self.start_iter = self.iter + 1
            if self.config_changes:
                apply_config_changes(self, self.config_changes)
            logger.info(
                f"resumed from {self.checkpointer.get_checkpoint_file()}, "
                f"continuing at iteration {self.start_iter}"
            )
        return resumed

    def train(self) -> None:  # type: ignore[override]
        rank, world = comm.get_rank(), comm.get_world_size()
        if comm.get_local_rank() == 0:  # one warning per machine: its processes share /dev/shm
            check_shared_memory(self.cfg, world, comm.get_local_size())
        self.reset_data_loader(
            lambda: prefetch_to_device(  # on a GPU the next batch is copied during this step
                build_pretrain_loader(self.cfg, rank, world, self.start_iter, self.source),
                self.cfg.MODEL.DEVICE,
            )
        )
        loop_logger = logging.getLogger("detectron2.engine.train_loop")
        quiet = _UserErrorWithoutTraceback()
        loop_logger.addFilter(quiet)
        watch = self._recompiles if self.policy.compile else contextlib.nullcontext()
        try:
            with watch:
                super().train(self.start_iter, self.max_iter)
        finally:
            loop_logger.removeFilter(quiet)

    def after_train(self) -> None:
        # The workers go first, while StopOnSignal still ignores SIGCHLD (torch's handler would
        # raise for a worker the stop signal killed), and in order: they finish on their "done"
        # event rather than at interpreter exit.
        self.close_data_loader()
        super().after_train()

    def close_data_loader(self) -> None:
        """Shut the data loader's workers down now (the next ``train()`` builds a new loader)."""
        it, self._data_loader_iter_obj = self._data_loader_iter_obj, None
        # what the iterator's __del__ calls; a persistent-workers DataLoader keeps a reference
        # to its iterator, so dropping ours would not run it
        shutdown = getattr(it, "_shutdown_workers", None)
        if shutdown is not None:
            shutdown()
        self.data_loader = None

    # -- checkpointed state -----------------------------------------------------------------
    def state_dict(self) -> dict:
        self._raise_if_not_finite()  # a non-finite state is never saved
        ret = super().state_dict()
        ret["rng"] = RngStates().state_dict()
        if self.grad_scaler is not None:
            ret["grad_scaler"] = self.grad_scaler.state_dict()
        # the unreadable files already warned about: a resumed run neither warns about them
        # again nor restarts data/skipped_files at 0
        ret["skipped_files"] = sorted(self._skipped)
        return ret

    def load_state_dict(self, state_dict: dict) -> None:
        super().load_state_dict(state_dict)
        rng = state_dict.get("rng")
        if rng:
            RngStates().load_state_dict(rng)
        self._skipped = set(state_dict.get("skipped_files", []))
        if self.grad_scaler is not None and "grad_scaler" in state_dict:
            self.grad_scaler.load_state_dict(state_dict["grad_scaler"])

    # -- one iteration ------------------------------------------------------------------------
    def run_step(self) -> None:
        """Fetch, forward, backward and step, with no host sync: the loss, its finiteness and
        the model's metrics stay on the device until :meth:`flush_metrics` reads them all at
        once, at each logging or checkpointing iteration."""
        assert self.model.training, "PretrainTrainer: model was changed to eval mode"
        start = time.perf_counter()
        data = self._fetch()
        data_time = time.perf_counter() - start
        # statistics that cost a host sync (||Q||_* alone with eigh) only where they will be
        # logged, or every step where the policy computes them sync-free
        data = {**data, "log_stats": self.policy.stats_every_step or self._flush_due()}
        with self._announce_compile():
            out = self._forward(data)
            losses = {k: v for k, v in out.items() if k.startswith("loss")}
            total = sum(losses.values())
            self._backward_and_step(total)
        self._pending.append(
            StepRecord(
                self.iter,
                {k: v.detach() for k, v in losses.items()},
                data_time,
                dict(out.get("metrics", {})),
                time.perf_counter() - start,
                list(data.get("skipped_files", [])),
            )
        )
        if self._flush_due():
            self.flush_metrics()

    def _fetch(self) -> dict:
        """The next batch; at this boundary between iterations, stop after a signal."""
        try:
            data, fetch_error = next(self._data_loader_iter), None
        except Exception as e:  # noqa: BLE001 - raised again unless a stop signal explains it
            data, fetch_error = None, e
        self.stop_on_signal.at_boundary(fetch_error)
        return data

    def _forward(self, data: dict) -> dict:
        """Colour augmentation on the device, then the model, under autocast."""
        with torch.autocast(
            self.device_type,
            dtype=self.amp_dtype or torch.bfloat16,
            enabled=self.amp_dtype is not None,
        ):
            # Inside autocast, as when the model ran it, so that AMP runs stay reproducible (the
            # contrast's grayscale mean is a matmul, which autocast lowers).
            data = augment_views_on_device(
                data,
                self._augment,
                self.device_type,
                apply_color=self.cfg.INPUT.COLOR_ON_DEVICE,
            )
            return self._model_call(self._model_inputs(data))

    @contextlib.contextmanager
    def _announce_compile(self) -> Iterator[None]:
        """Log the compilation (minutes with inductor) of each beta phase's first step, and a
        graph added by a later step whose cause torch did not report (the recompiles it reports
        are told by :meth:`_announce_recompile` as they start)."""
        if not self.policy.compile:
            yield
            return
        criterion = unwrap(self.model).criterion
        phase = criterion.prior.active(criterion.beta)
        what = "the prior on" if phase else "beta = inf"
        self._first_of_phase = phase not in self._compiled_phases
        graphs, causes = compiled_graphs(), len(self._recompiles.causes)
        start = time.perf_counter()
        if self._first_of_phase:
            backend = self.policy.compile["backend"]
            logger.info(f"compiling the step ({backend}, {what}); inductor takes minutes ...")
        yield
        seconds = time.perf_counter() - start
        if self._first_of_phase:
            self._compiled_phases.add(phase)
            logger.info(f"compiled the step ({what}) in {seconds:.1f} s")
        elif compiled_graphs() > graphs and len(self._recompiles.causes) == causes:
            logger.warning(
                f"recompiled the step at iteration {self.iter} ({seconds:.1f} s); this torch "
                "does not say why (TORCH_LOGS=recompiles)"
            )

    def _announce_recompile(self, cause: str) -> None:
        """One line per recompile torch starts, with its cause: information within a beta
        phase's first step (its compile: one graph per input resolution, say), a warning after
        (a stall of minutes per step on a GPU)."""
        where = f"recompiling the step at iteration {self.iter}"
        if self._first_of_phase:
            logger.info(f"{where} (its beta phase's first step): {cause}")
        else:
            logger.warning(f"{where}: {cause}")

    def _model_inputs(self, data: dict) -> dict:
        """What the model reads of the batch: tensors of fixed shapes and constants only (a
        compiled forward guards on every Python value it reads)."""
        keys = ("views", "shuffle_plans", "log_stats")
        return {k: data[k] for k in keys if k in data}

    def _raise_if_not_finite(self) -> None:
        """:class:`NonFiniteLossError` naming the run's last checkpoint if a loss was not finite;
        every checkpoint follows a flush, so a non-finite state is never saved."""
        first_bad = int(self._first_bad)
        if first_bad < 0:
            return
        out = self.cfg.OUTPUT_DIR
        fix = "a lower SOLVER.BASE_LR, a larger LOSS.BETA or SOLVER.AMP.ENABLED False"
        if self.checkpointer.has_checkpoint():  # OUTPUT_DIR/last_checkpoint: the real last one
            last = (
                f"the last checkpoint, {self.checkpointer.get_checkpoint_file()}, is intact and "
                f"the same command resumes from it (with {RESUME_FLAG} SOLVER.BASE_LR <lower>: "
                "at a lower learning rate)"
            )
            fix = "a larger LOSS.BETA or SOLVER.AMP.ENABLED False"
        else:
            last = f"no checkpoint was written in {out}"
        # a resume keeps the saved config but for RESUME_WITH_CHANGES (pretrain/config/resume.py)
        raise NonFiniteLossError(
            f"non-finite loss at iteration {first_bad}; stopped: {last}. To train with {fix}, "
            "start afresh in another OUTPUT_DIR"
        )

    def _backward_and_step(self, total: torch.Tensor) -> None:
        self.optimizer.zero_grad(set_to_none=True)
        if self.grad_scaler is not None:
            self.grad_scaler.scale(total).backward()
            self.after_backward()
            self.grad_scaler.step(self.optimizer)
            self.grad_scaler.update()
        else:
            total.backward()
            self.after_backward()
            self.optimizer.step()

    def _flush_due(self) -> bool:
        """Whether this iteration is one that the writers or the checkpointer act on."""
        it, s = self.iter + 1, self.cfg.SOLVER
        return it % s.LOG_PERIOD == 0 or it % s.CHECKPOINT_PERIOD == 0 or it >= self.max_iter

    def flush_metrics(self) -> None:
        """Read the buffered iterations' device values at once and log them as detectron2's
        ``write_metrics`` would have; every rank calls it at the same iterations, so the records
        travel in one ``all_gather`` here, not in every iteration."""
        records = self._pending.take()  # one device-to-host read
        if not records:
            return
        bad = [r.iteration for r in records if not math.isfinite(r.total_loss)]
        if bad and self._first_bad < 0:
            self._first_bad = bad[0]
        self._raise_if_not_finite()
        per_rank = comm.all_gather(records) if comm.get_world_size() > 1 else [records]
        storage = get_event_storage()
        for j, mine in enumerate(records):
            at = [rank_records[j] for rank_records in per_rank]
            storage.put_scalar("rank_data_time", mine.data_time, cur_iter=mine.iteration)
            if comm.is_main_process():
                # as detectron2's SimpleTrainer.write_metrics: slowest rank, mean of the losses
                data_time = np.max([r.data_time for r in at])
                storage.put_scalar("data_time", data_time, cur_iter=mine.iteration)
                losses = {k: np.mean([r.losses[k] for r in at]) for k in mine.losses}
                storage.put_scalar("total_loss", sum(losses.values()), cur_iter=mine.iteration)
                if len(losses) > 1:
                    storage.put_scalars(cur_iter=mine.iteration, **losses)
            for r in at:  # every rank (and rank 0's checkpoint) keeps the union
                self._note_skipped(r.skipped)
            metrics = dict(mine.metrics)
            metrics["images_per_sec"] = self.cfg.SOLVER.IMS_PER_BATCH / max(mine.step_time, 1e-9)
            metrics["data/skipped_files"] = float(len(self._skipped))
            storage.put_scalars(**metrics, smoothing_hint=False, cur_iter=mine.iteration)

    def _note_skipped(self, skipped: list[str]) -> None:
        """Warn once per unreadable file."""
        for path in skipped:
            if path not in self._skipped:
                self._skipped.add(path)
                logger.warning(f"skipped unreadable image: {path}")
