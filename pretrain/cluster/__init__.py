"""Running pretraining (and the evaluation tools) as SLURM jobs through submitit: the layer on top.

* :mod:`pretrain.cluster.jobs`: the checkpointable callables a SLURM job runs.
* :mod:`pretrain.cluster.submit`: building and submitting those jobs, and asking SLURM which
  are still queued (``tools/submit_pretrain.py``, ``tools/study.py --executor slurm``).

Both import submitit; nothing below this room does. What every process needs with or without
submitit lives below the engine: joining torch.distributed from torchrun / SLURM / submitit
variables in :mod:`pretrain.utils.distributed`, the stop signals, requeueing and shielded data
workers in :mod:`pretrain.utils.signals`, and the trainer's stop-at-a-boundary hook in
:mod:`pretrain.engine.hooks`. See docs/cluster.md.

May import: :mod:`pretrain.utils`, :mod:`pretrain.config`, :mod:`pretrain.engine` (the jobs
run the trainer).
"""
