"""Running pretraining (and the evaluation tools) on clusters: SLURM through submitit, torchrun.

* :mod:`pretrain.cluster.distributed`: torch.distributed from torchrun / SLURM / submitit variables.
* :mod:`pretrain.cluster.preemption`: stop at an iteration boundary on SIGTERM/SIGUSR1/SIGUSR2,
  save, requeue.
* :mod:`pretrain.cluster.jobs`: the checkpointable callables a SLURM job runs.
* :mod:`pretrain.cluster.submit`: building and submitting those jobs (``tools/submit_pretrain.py``).

Only the last two import submitit; the trainer uses the first two. See docs/cluster.md.

May import: :mod:`pretrain.utils`, :mod:`pretrain.config`, :mod:`pretrain.engine` (the jobs
run the trainer).
"""
