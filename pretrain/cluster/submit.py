"""Submitting pretraining, an evaluation tool or a callable to SLURM with submitit (or running
it locally), and asking SLURM which jobs of a submitit folder are still queued: the one module
that talks to SLURM. ``tools/submit_pretrain.py`` (:mod:`pretrain.cli.submit_pretrain`) and
``tools/study.py --executor slurm`` (:mod:`transfer.study.slurm`) submit through it. A job:

* ``--entry pretrain``: one SLURM task per process, ``--gpus-per-node`` tasks per node (one per
  GPU) or, on CPU nodes (``--gpus-per-node 0``), ``--tasks-per-node`` processes;
* ``--entry train_net|linear_probe|semi_supervised``: one task per node that runs the tool with
  detectron2's ``launch`` (``--num-gpus`` = GPUs, or ``--tasks-per-node`` CPU processes);
* a callable of the layer above (:data:`FUNCTION_ENTRY`): one task calls it.

A pretraining task's default ``--cpus-per-task``: :func:`_pretrain_cpus_per_task`. Submission
problems (impossible requests, a partition SLURM refuses, a pretraining job whose folder holds a
job still queued or running) raise :class:`SubmitError`, whose message is one line.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import subprocess
from dataclasses import dataclass, field
from typing import NamedTuple

import submitit
from fvcore.common.config import CfgNode
from submitit.core.utils import FailedJobError

from pretrain.cluster.jobs import PretrainJob, ToolJob, tool_command
from pretrain.utils.distributed import FAIL_FAST_ENV
from pretrain.utils.errors import LoracError
from pretrain.utils.output_dir import check_output_dir

__all__ = [
    "DEFAULT_CPUS_PER_GPU",
    "ENTRIES",
    "FUNCTION_ENTRY",
    "BuiltJob",
    "JobRequest",
    "SubmitError",
    "build_job",
    "check_no_live_job",
    "check_pretrain_data",
    "dry_run_text",
    "job_ids",
    "node_cpus_per_task",
    "queued_jobs",
    "slurm_parameters",
    "submit",
]

# entry -> the tool's module, which a node runs as `python -m MODULE` (pretrain runs in-process,
# one task per process). Module names, not imports: the evaluation tools live in transfer/, a
# layer above this one, and run in their own processes.
ENTRIES = {
    "pretrain": "pretrain.cli.train_pretrain",
    "train_net": "transfer.cli.train_net",
    "linear_probe": "transfer.cli.linear_probe",
    "semi_supervised": "transfer.cli.semi_supervised",
}
# Not a tool: a picklable callable of the layer above (JobRequest.function) that one task runs,
# such as the study's own evaluation of a checkpoint (transfer.study.slurm). Not a
# submit_pretrain --entry.
FUNCTION_ENTRY = "function"


# --cpus-per-task of a pretraining task with DATALOADER.NUM_WORKERS -1 where sinfo cannot say
# what the nodes have: the cores per GPU of the common 8-GPU node with 2 x 64 cores (DGX A100;
# 112 / 8 = 14 on a DGX H100: sinfo, or --cpus-per-task, says so there).
DEFAULT_CPUS_PER_GPU = 16
_GPU_GRES = re.compile(r"gpu(?::[^:,(]+)?:(\d+)")


class SubmitError(LoracError):
    """A request that cannot be submitted; the message is one line."""


@dataclass
class JobRequest:
    """Resources and the command of one job (``tools/submit_pretrain.py`` flags)."""

    entry: str = "pretrain"
    config_file: str = ""
    args: list[str] = field(default_factory=list)  # pretrain: KEY VALUE ...; tools: their flags
    nodes: int = 1
    gpus_per_node: int = 1
    tasks_per_node: int | None = None  # CPU processes per node (with --gpus-per-node 0)
    partition: str | None = None
    timeout_min: int = 72 * 60
    cpus_per_task: int | None = None
    mem_gb: float | None = None
    account: str | None = None
    qos: str | None = None
    constraint: str | None = None
    job_name: str = "lorac"
    job_dir: str = ""  # submitit's folder (scripts, pickles, logs); default below
    signal_delay_s: int = 120  # the time-limit warning (USR2) comes this long before the limit
    extra_hooks: list = field(default_factory=list)  # pretrain only; picklable HookBase objects
    # the jobs (ids) this one waits for: it starts once they all ended well (afterok) and SLURM
    # cancels it when one of them failed
    after_ok: list[str] = field(default_factory=list)
    function: object = None  # entry "function": the callable one task runs

    def check(self, local: bool = False) -> None:
        """Raise :class:`SubmitError` for requests no cluster can satisfy."""
        if self.entry not in ENTRIES and self.entry != FUNCTION_ENTRY:
            raise SubmitError(f"--entry {self.entry!r}: choose one of {', '.join(ENTRIES)}")
        for name, value, low in [
            ("--nodes", self.nodes, 1),
            ("--gpus-per-node", self.gpus_per_node, 0),
            ("--timeout", self.timeout_min, 1),
            ("--tasks-per-node", self.tasks_per_node, 1),
            ("--cpus-per-task", self.cpus_per_task, 1),
            ("--signal-delay", self.signal_delay_s, 0),
        ]:
            if value is not None and value < low:
                raise SubmitError(f"{name} must be >= {low}, got {value}")
        if self.mem_gb is not None and self.mem_gb <= 0:
            raise SubmitError(f"--mem must be > 0 (GB), got {self.mem_gb}")
        if self.gpus_per_node and self.tasks_per_node not in (None, self.gpus_per_node):
            raise SubmitError(
                f"--tasks-per-node {self.tasks_per_node} with --gpus-per-node "
                f"{self.gpus_per_node}: there is one process per GPU (omit --tasks-per-node)"
            )
        if self.signal_delay_s >= 60 * self.timeout_min:
            raise SubmitError(
                f"--signal-delay {self.signal_delay_s}s is not shorter than --timeout "
                f"{self.timeout_min} min: the job would be told to stop as it starts"
            )
        if local and self.nodes != 1:
            raise SubmitError(f"--local runs on this machine: --nodes must be 1, got {self.nodes}")
        if (self.entry == FUNCTION_ENTRY) != (self.function is not None):
            raise SubmitError(f"entry {FUNCTION_ENTRY!r} goes with a callable (function=...)")
        if self.entry == "pretrain" and not self.config_file:
            raise SubmitError("--entry pretrain needs --config-file")
        if self.entry == "pretrain" and any(a.startswith("--") for a in self.args):
            bad = next(a for a in self.args if a.startswith("--"))
            raise SubmitError(f"unknown flag {bad} (pretraining takes KEY VALUE overrides only)")

    @property
    def procs_per_node(self) -> int:
        return self.gpus_per_node or self.tasks_per_node or 1

    @property
    def world_size(self) -> int:
        return self.nodes * self.procs_per_node


def resolve_pretrain_config(req: JobRequest) -> tuple[CfgNode, list[str]]:
    """The config the job will run (validated for its world size), and the overrides to pass.

    ``--gpus-per-node 0`` adds ``MODEL.DEVICE cpu``; GPUs with ``MODEL.DEVICE cpu`` is refused.
    """
    from pretrain.config.defaults import ConfigError, load_config, validate_cfg
    from pretrain.config.world_size import resolve_world_size
    from pretrain.engine.launch import _normalise_opts  # the job's own setup() does the same

    opts = _normalise_opts(list(req.args))
    try:
        cfg = load_config(req.config_file, opts)
        if req.gpus_per_node == 0 and cfg.MODEL.DEVICE != "cpu":
            opts += ["MODEL.DEVICE", "cpu"]
            cfg = load_config(req.config_file, opts)
        cfg = resolve_world_size(cfg, req.world_size)  # SOLVER.REFERENCE_WORLD_SIZE
        validate_cfg(cfg, req.world_size)
    except ConfigError as e:
        raise SubmitError(f"config: {e}") from None
    if req.gpus_per_node and cfg.MODEL.DEVICE == "cpu":
        raise SubmitError(
            f"--gpus-per-node {req.gpus_per_node} but MODEL.DEVICE is cpu: use --gpus-per-node 0 "
            "--tasks-per-node N for CPU processes"
        )
    return cfg, opts


def node_cpus_per_task(req: JobRequest) -> int | None:
    """The cores of one GPU's share of a node of the job's partition (``--partition``, else the
    default one), or of one process's on CPU nodes (cores / ``--tasks-per-node``), from
    ``sinfo``'s CPUs and GRES per node; the smallest over the partition's kinds of node.

    ``None`` where ``sinfo`` is missing, fails, or lists no node with GPUs for a GPU job.
    """
    cmd = ["sinfo", "--noheader", "--format", "%P|%c|%G"]
    if req.partition:
        cmd += ["--partition", req.partition]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=30, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    rows = [line.split("|") for line in out.splitlines() if line.count("|") == 2]
    if not req.partition:  # the default partition is the one sinfo marks with a *
        rows = [r for r in rows if r[0].endswith("*")] or rows
    shares = []
    for _, cpus, gres in rows:
        cpus = cpus.rstrip("+")
        if not cpus.isdigit():
            continue
        per_node = sum(int(n) for n in _GPU_GRES.findall(gres)) if req.gpus_per_node else None
        if per_node is None:
            per_node = req.procs_per_node
        if per_node > 0:
            shares.append(int(cpus) // per_node)
    return min(shares) if shares and min(shares) > 0 else None


def _pretrain_cpus_per_task(req: JobRequest, cfg: CfgNode) -> int:
    """--cpus-per-task's default for pretraining: a core per data worker and one for the
    training process; with NUM_WORKERS -1 (a worker per core) the node's cores per task."""
    workers = cfg.DATALOADER.NUM_WORKERS
    if workers >= 0:
        return workers + 1
    if workers != -1:
        raise SubmitError(
            f"config: DATALOADER.NUM_WORKERS = {workers}: a number >= 0, or -1 for one per core"
        )
    if req.cpus_per_task:  # given: sinfo need not be asked
        return req.cpus_per_task
    return node_cpus_per_task(req) or DEFAULT_CPUS_PER_GPU


class BuiltJob(NamedTuple):
    function: object  # what every task calls: a PretrainJob, ToolJob or JobRequest.function
    folder: str  # submitit's folder: sbatch script, pickles, logs
    description: str  # the resolved config, or the command every node runs
    cpus_per_task: int | None  # the default when --cpus-per-task is not given


def build_job(req: JobRequest) -> BuiltJob:
    """The callable a checked request runs, and where its submitit files go."""
    if req.entry == "pretrain":
        cfg, opts = resolve_pretrain_config(req)
        return BuiltJob(
            PretrainJob(os.path.abspath(req.config_file), opts, req.extra_hooks),
            req.job_dir or os.path.join(cfg.OUTPUT_DIR, "submitit"),
            "# resolved config (OUTPUT_DIR/config.yaml once the job starts)\n" + cfg.dump(),
            _pretrain_cpus_per_task(req, cfg),
        )
    if req.entry == FUNCTION_ENTRY:
        return BuiltJob(
            req.function,
            req.job_dir or os.path.join("output", "submitit", "function"),
            f"# one task runs\n{req.function!r}\n",
            None,
        )
    module = ENTRIES[req.entry]
    argv = (["--config-file", req.config_file] if req.config_file else []) + list(req.args)
    cmd = tool_command(module, argv, req.procs_per_node, req.nodes, "<node id>", "<first node>",
                       "<port from job id>")  # fmt: skip
    return BuiltJob(
        ToolJob(module, argv, req.procs_per_node),
        req.job_dir or os.path.join("output", "submitit", req.entry),
        "# every node runs\n" + " ".join(cmd) + "\n",
        None,
    )


def slurm_parameters(req: JobRequest, cpus_per_task: int | None = None) -> dict:
    """sbatch parameters (submitit ``SlurmExecutor`` names) for the request."""
    per_node_tasks = req.procs_per_node if req.entry == "pretrain" else 1
    additional: dict = {"requeue": True}
    if req.after_ok:
        additional["kill_on_invalid_dep"] = "yes"
    params = {
        "job_name": req.job_name,
        "partition": req.partition,
        "time": req.timeout_min,
        "nodes": req.nodes,
        "ntasks_per_node": per_node_tasks,
        "gpus_per_node": req.gpus_per_node or None,
        "cpus_per_task": req.cpus_per_task or cpus_per_task,
        "mem": None if req.mem_gb is None else f"{int(req.mem_gb * 1024)}MB",
        "account": req.account,
        "qos": req.qos,
        "constraint": req.constraint,
        "signal_delay_s": req.signal_delay_s,
        # requeueable even where the cluster's JobRequeue=0 (we requeue on the time-limit signal)
        "additional_parameters": additional,
        "dependency": "afterok:" + ":".join(req.after_ok) if req.after_ok else None,
        # Fail fast: a task that exits with an error ends the whole step (the others would wait
        # in their next collective until the time limit), and NCCL aborts a failed or timed-out
        # collective instead of hanging (see pretrain/utils/distributed.py).
        "srun_args": ["--kill-on-bad-exit=1"],
        "setup": [f"export {k}={v}" for k, v in FAIL_FAST_ENV.items()],
    }
    return {k: v for k, v in params.items() if v is not None}


class _RenderOnlyExecutor(submitit.SlurmExecutor):
    """Renders the sbatch script on machines without SLURM (``--dry-run``)."""

    @classmethod
    def affinity(cls) -> int:
        return 2


def dry_run_text(req: JobRequest, local: bool = False) -> str:
    """What ``--dry-run`` prints: the sbatch script (or local parameters) and the job's command."""
    req.check(local)
    built = build_job(req)
    if local:
        head = f"# local run: {req.procs_per_node} process(es), submitit folder {built.folder}\n"
        return head + built.description
    ex = _RenderOnlyExecutor(folder=os.path.join(built.folder, "%j"))
    try:
        ex.update_parameters(**slurm_parameters(req, built.cpus_per_task))
    except ValueError as e:
        raise SubmitError(str(e).splitlines()[0]) from None
    # submitit has no public call that renders without submitting; these two build exactly the
    # file that submit() would pass to sbatch.
    script = ex._make_submission_file_text(ex._submitit_command_str, "dry-run")
    return f"# sbatch script\n{script}\n{built.description}"


def _check_local_gpus(req: JobRequest) -> None:
    """``--local`` with GPUs on a machine where CUDA is not visible: refused here, once, rather
    than by every task (``MODEL.DEVICE cuda`` never falls back to the CPU)."""
    import torch

    if req.gpus_per_node and not torch.cuda.is_available():
        raise SubmitError(
            f"--local --gpus-per-node {req.gpus_per_node} but CUDA is not visible on this "
            "machine: use --gpus-per-node 0 --tasks-per-node N (MODEL.DEVICE cpu)"
        )


def check_pretrain_data(req: JobRequest) -> None:
    """Refuse a pretraining job whose data is not there before it is submitted (it would fail
    on a node after its wait in the queue). The submitting machine sees the cluster's shared
    file system, as the job's paths do."""
    if req.entry != "pretrain":
        return
    from pretrain.engine.launch import check_data, check_run_dir

    cfg = resolve_pretrain_config(req)[0]
    check_run_dir(cfg.OUTPUT_DIR)
    check_data(cfg)


# submitit's job folders: <folder>/<job id> (%j), <job id>_<task> for arrays
_JOB_FOLDER = re.compile(r"(\d+)(?:_\d+)?")


def job_ids(folder: str) -> list[str]:
    """The ids of the jobs submitted with ``folder`` as submitit's folder (``submit`` puts each
    job's script, pickles and logs in ``folder/<job id>``), oldest first."""
    if not os.path.isdir(folder):
        return []
    ids = {m.group(1) for f in os.listdir(folder) if (m := _JOB_FOLDER.fullmatch(f))}
    return sorted(ids, key=int)


def queued_jobs() -> dict[str, str]:
    """``{job id: state}`` of every job of this user that SLURM has not ended (pending, running,
    suspended...: what ``squeue`` lists by default; the user's jobs only, so a large cluster's
    queue is not read whole). Raises :class:`SubmitError` with SLURM's own words (its controller
    down, a bad SLURM_CONF) where ``squeue`` fails."""
    try:
        # squeue takes user id numbers as well as names: no passwd lookup that a container lacks
        cmd = ["squeue", "--noheader", "--format=%i|%T", f"--user={os.getuid()}"]
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=True).stdout
    except subprocess.CalledProcessError as e:
        said = "; ".join(ln.strip() for ln in (e.stderr or "").splitlines() if ln.strip())
        raise SubmitError(
            f"cannot ask SLURM for the queue: squeue exited with status {e.returncode}: "
            f"{said or 'no message'}"
        ) from None
    except (OSError, subprocess.SubprocessError) as e:
        raise SubmitError(f"cannot ask SLURM for the queue (squeue): {e}") from None
    rows = (line.strip().split("|") for line in out.splitlines())
    return {row[0]: row[1] for row in rows if len(row) == 2}


def check_no_live_job(req: JobRequest, folder: str) -> None:
    """Refuse a pretraining job whose submitit ``folder`` (by default OUTPUT_DIR/submitit) holds
    a job SLURM still queues or runs: the two would train into one OUTPUT_DIR. A job that ended
    leaves its folder and is no obstacle (the next one resumes from its checkpoint); where squeue
    cannot say, sbatch will."""
    ids = job_ids(folder) if req.entry == "pretrain" else []
    try:
        queue = queued_jobs() if ids else {}
    except SubmitError:
        return
    live = [job for job in ids if job in queue]
    if live:
        job = live[-1]
        raise SubmitError(
            f"{folder} holds job {job}, still {queue[job].lower()}: a second job would train "
            f"into the same OUTPUT_DIR; wait for it to end, cancel it (scancel {job}), or choose "
            "another OUTPUT_DIR"
        )


def submit(req: JobRequest, local: bool = False) -> submitit.Job:
    """Submit the job (SLURM) or start it on this machine (``local``); returns submitit's Job."""
    req.check(local)
    built = build_job(req)
    if local:
        _check_local_gpus(req)
    check_pretrain_data(req)
    if not local:
        check_no_live_job(req, built.folder)
    # submitit creates it (a pretraining job's default: OUTPUT_DIR/submitit)
    check_output_dir(built.folder, "--job-dir" if req.job_dir else "the job folder", SubmitError)
    folder = os.path.join(built.folder, "%j")
    if local:
        ex = submitit.LocalExecutor(folder=folder)
        ex.update_parameters(
            timeout_min=req.timeout_min,
            tasks_per_node=req.procs_per_node if req.entry == "pretrain" else 1,
            gpus_per_node=req.gpus_per_node,
            signal_delay_s=req.signal_delay_s,
        )
        return ex.submit(built.function)
    try:
        ex = submitit.SlurmExecutor(folder=folder)
    except RuntimeError:
        raise SubmitError(
            "no SLURM here (srun not found): use --local to run on this machine, or --dry-run"
        ) from None
    try:
        ex.update_parameters(**slurm_parameters(req, built.cpus_per_task))
    except ValueError as e:
        raise SubmitError(str(e).splitlines()[0]) from None
    stderr = io.StringIO()
    # submitit writes the pickled job and its sbatch script before sbatch answers: a refused
    # submission takes them (and the folders made for them) away again, leaving nothing written
    made = _missing_folders(built.folder)
    before = set(os.listdir(built.folder)) if not made else set()
    try:
        with contextlib.redirect_stderr(stderr):  # submitit echoes sbatch's stderr; we report it
            return ex.submit(built.function)
    except FailedJobError as e:
        _remove_new(built.folder, before, made)
        lines = [ln.removeprefix("sbatch: error: ").strip() for ln in str(e).splitlines()]
        reason = "; ".join(ln for ln in lines if ln) or "no message"
        if _NO_CONTROLLER.search(reason):
            raise SubmitError(
                f"sbatch could not reach a SLURM cluster ({reason}): check that `sinfo` lists "
                "this cluster's partitions from this machine (or ask its admins), or run on "
                "this machine instead (submit_pretrain --local, study --executor local)"
            ) from None
        raise SubmitError(f"sbatch rejected the job: {reason}") from None
    except OSError as e:  # sbatch itself missing or not executable
        _remove_new(built.folder, before, made)
        raise SubmitError(f"cannot run sbatch: {e}") from None


# sbatch's words where no SLURM controller answers (none running, a wrong or missing
# slurm.conf, munge not running), as opposed to a controller that refuses the request
_NO_CONTROLLER = re.compile(
    r"contact slurm controller|configuration source|slurm\.conf|munge|Socket timed out|"
    r"Connection refused|Zero Bytes were transmitted",
    re.IGNORECASE,
)


def _missing_folders(folder: str) -> list[str]:
    """``folder`` and those of its parents that do not exist yet, deepest first."""
    missing, path = [], os.path.abspath(folder)
    while not os.path.exists(path):
        missing.append(path)
        path = os.path.dirname(path)
    return missing


def _remove_new(folder: str, before: set[str], made: list[str]) -> None:
    """Remove what a failed submission left: the entries of ``folder`` not in ``before`` (files:
    submitit's pickle and script) and the folders of ``made`` (deepest first) once empty."""
    if os.path.isdir(folder):
        for name in set(os.listdir(folder)) - before:
            path = os.path.join(folder, name)
            if os.path.isfile(path) or os.path.islink(path):
                os.unlink(path)
    for path in made:
        with contextlib.suppress(OSError):  # not empty: something else wrote there meanwhile
            os.rmdir(path)
