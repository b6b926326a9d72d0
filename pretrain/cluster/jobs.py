"""What a submitted job runs: checkpointable callables (submitit ``helpers.Checkpointable``).

* :class:`PretrainJob`: one task per process (per GPU, or per CPU process). Each task joins
  torch.distributed from its SLURM/submitit variables (``pretrain.engine.launch.setup``), builds
  the trainer, resumes from ``OUTPUT_DIR/last_checkpoint`` and trains. Preemption and time-limit
  signals are handled at iteration boundaries by the trainer's ``StopOnSignal`` hook.
* :class:`ToolJob`: one task per node running a detectron2-``launch`` tool as ``python -m
  MODULE`` (``transfer.cli.train_net``, ``transfer.cli.linear_probe``, ...) with
  ``--num-machines/--machine-rank/--dist-url`` from the job; ``launch`` then starts the node's
  processes. Requeued runs get ``--resume``.

If a time-limit signal arrives before training started (while the trainer is still being
built), submitit's own handler calls ``checkpoint()``: for both classes that is "run the same
thing again", which resumes from the last checkpoint, and submitit requeues the job.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Sequence

from submitit.helpers import Checkpointable, DelayedSubmission

from pretrain.utils.distributed import first_host, job_port

__all__ = ["PretrainJob", "ToolJob", "tool_command"]


class PretrainJob(Checkpointable):
    """Pretraining in one task. ``opts`` are config overrides (KEY VALUE ...); ``extra_hooks``
    (picklable ``HookBase`` objects) are registered after the trainer's own hooks."""

    def __init__(self, config_file: str, opts: Sequence[str], extra_hooks: Sequence = ()) -> None:
        self.config_file = config_file
        self.opts = list(opts)
        self.extra_hooks = list(extra_hooks)

    def __call__(self) -> str:
        from pretrain.engine.launch import argument_parser, setup
        from pretrain.engine.run import run_pretraining

        parser = argument_parser("pretraining job")
        args = parser.parse_args(["--config-file", self.config_file, *self.opts])
        cfg = setup(args)  # joins the process group from SLURM_* / SUBMITIT_LOCAL_* variables
        run_pretraining(cfg, self.extra_hooks)
        # Done: a time-limit warning arriving now must not kill the exiting process (Python
        # resets handled signals to their default action, "terminate", during shutdown) and
        # turn a finished job into a failed one. Ignored signals are left ignored.
        for sig in (signal.SIGUSR1, signal.SIGUSR2):
            signal.signal(sig, signal.SIG_IGN)
        return os.path.join(cfg.OUTPUT_DIR, "model_final.pth")


def tool_command(
    module: str,
    argv: Sequence[str],
    procs_per_node: int,
    num_nodes: int,
    node: int | str,
    master: str,
    port: int | str,
) -> list[str]:
    """The command line one node runs: ``python -m module`` with detectron2's multi-machine
    ``launch`` flags (``node``, ``master`` and ``port`` may be placeholders, for ``--dry-run``)
    before ``argv``, whose trailing ``KEY VALUE`` overrides would take in flags after them."""
    return [
        sys.executable,
        "-m",
        module,
        "--num-gpus",
        str(procs_per_node),
        "--num-machines",
        str(num_nodes),
        "--machine-rank",
        str(node),
        "--dist-url",
        f"tcp://{master}:{port}",
        *argv,
    ]


class ToolJob(Checkpointable):
    """A detectron2-``launch`` tool (``python -m module``) on every node of the job (one task per
    node)."""

    def __init__(self, module: str, argv: Sequence[str], procs_per_node: int) -> None:
        self.module, self.argv, self.procs_per_node = module, list(argv), procs_per_node

    def __call__(self) -> int:
        from submitit import JobEnvironment

        job = JobEnvironment()
        nodelist = os.environ.get("SLURM_JOB_NODELIST")
        master = first_host(nodelist) if nodelist else "127.0.0.1"
        restart = int(os.environ.get("SLURM_RESTART_COUNT", 0))
        cmd = tool_command(
            self.module,
            self.argv,
            self.procs_per_node,
            job.num_nodes,
            job.node,
            master,
            job_port(job.job_id, restart),
        )
        print("running:", " ".join(cmd), flush=True)
        code = subprocess.call(cmd)
        if code:
            raise RuntimeError(f"{self.module} exited with status {code}")
        return code

    def checkpoint(self, *args, **kwargs) -> DelayedSubmission:
        # The tool saved periodic checkpoints itself; the requeued run continues from them.
        argv = self.argv if "--resume" in self.argv else ["--resume", *self.argv]  # not last
        return DelayedSubmission(ToolJob(self.module, argv, self.procs_per_node))
