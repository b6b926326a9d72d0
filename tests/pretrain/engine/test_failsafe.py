"""Failing safely (docs/cluster.md): CUDA asked for but not visible stops the run; a failed task
ends the SLURM step and collectives time out; one live run per OUTPUT_DIR; a /dev/shm smaller
than the data loaders need is reported at start-up."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
from collections import namedtuple
from datetime import timedelta
from pathlib import Path

import pytest
import torch

from pretrain.config.defaults import ConfigError, get_cfg, load_config
from tests.helpers import ROOT, tiny_opts
from tests.helpers.mistakes import ToolResult, run_main, tool_main
from transfer.classification.demo import DEMO_CONFIG


def _tool(*argv: str) -> ToolResult:
    """tools/train_pretrain.py's ``main`` in this process (the lock's holder is another one)."""
    return run_main(tool_main("tools/train_pretrain.py"), ["--config-file", DEMO_CONFIG, *argv])


def _error_lines(stderr: str) -> list[str]:
    return [ln for ln in stderr.splitlines() if ln.startswith("error: ")]


# -- 1. CUDA asked for where none is visible --------------------------------------------------


def test_cuda_without_visible_cuda_stops_the_tool_with_status_2(
    tmp_path, image_folder, capsys, monkeypatch
):
    """No silent CPU fallback: one error line naming MODEL.DEVICE and the fix, nothing trained."""
    from pretrain.cli.train_pretrain import main

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    out = tmp_path / "run"
    opts = tiny_opts(image_folder, out, **{"MODEL.DEVICE": "cuda", "SOLVER.MAX_ITER": 1})
    with pytest.raises(SystemExit) as e:
        main(["--config-file", DEMO_CONFIG, *opts])
    assert e.value.code == 2
    (line,) = _error_lines(capsys.readouterr().err)
    assert "MODEL.DEVICE" in line and "CUDA is not visible" in line and "MODEL.DEVICE cpu" in line
    assert not (out / "last_checkpoint").exists() and not (out / "model_final.pth").exists()


def test_local_gpu_job_without_visible_cuda_is_refused_before_it_starts(tmp_path, capsys,
                                                                         monkeypatch):  # fmt: skip
    from pretrain.cli.submit_pretrain import main as submit

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    opts = tiny_opts(tmp_path / "data", tmp_path / "out", **{"MODEL.DEVICE": "cuda"})
    with pytest.raises(SystemExit) as e:
        submit(["--config-file", DEMO_CONFIG, "--local", "--gpus-per-node", "1", *opts])
    assert e.value.code == 2
    (line,) = _error_lines(capsys.readouterr().err)
    assert "CUDA is not visible" in line and "--gpus-per-node 0" in line
    assert not (tmp_path / "out" / "submitit").exists()  # nothing started


def test_trainer_built_without_the_tool_refuses_cuda_too(tmp_path, image_folder, monkeypatch):
    """The demo and the study build the trainer directly: same error, before any file."""
    from pretrain.engine.trainer import PretrainTrainer

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    out = tmp_path / "run"
    cfg = load_config(DEMO_CONFIG, tiny_opts(image_folder, out, **{"MODEL.DEVICE": "cuda"}))
    with pytest.raises(ConfigError, match=r"MODEL.DEVICE = 'cuda' but CUDA is not visible"):
        PretrainTrainer(cfg)
    assert not (out / "config.yaml").exists()


# -- 2. a failed task ends the job; collectives time out ----------------------------------------


def test_sbatch_ends_the_step_on_a_failed_task_and_sets_nccl_async_errors(tmp_path, capsys):
    from pretrain.cli.submit_pretrain import main as submit

    opts = tiny_opts(tmp_path / "data", tmp_path / "out", **{"MODEL.DEVICE": "cuda"})
    assert submit(["--config-file", DEMO_CONFIG, "--gpus-per-node", "2", "--dry-run", *opts]) == 0
    script = capsys.readouterr().out.split("# resolved config")[0].splitlines()
    (srun,) = [ln for ln in script if ln.startswith("srun ")]
    assert "--kill-on-bad-exit=1" in srun.split()
    export = script.index("export TORCH_NCCL_ASYNC_ERROR_HANDLING=1")
    assert export < script.index(srun)  # in the environment srun hands to every task


def test_default_timeout_is_at_most_10_minutes_and_must_be_positive():
    assert 0 < get_cfg().DIST.TIMEOUT_MINUTES <= 10
    for bad in ("0", "-1"):
        with pytest.raises(ConfigError, match="DIST.TIMEOUT_MINUTES"):
            load_config(DEMO_CONFIG, ["DATASETS.ROOT", "/x", "DIST.TIMEOUT_MINUTES", bad])


def test_timeout_and_async_errors_reach_init_process_group(tmp_path, monkeypatch):
    """Under torchrun/srun variables, setup() joins with DIST.TIMEOUT_MINUTES and NCCL's
    asynchronous error handling in the environment."""
    import torch.distributed as dist
    from detectron2.utils import comm

    from pretrain.engine.launch import argument_parser, setup

    seen = {}

    def fake_init(**kwargs):
        seen.update(kwargs, env=os.environ.get("TORCH_NCCL_ASYNC_ERROR_HANDLING"))

    monkeypatch.setattr(dist, "init_process_group", fake_init)
    monkeypatch.setattr(comm, "create_local_process_group", lambda n: None)
    monkeypatch.setattr(comm, "synchronize", lambda: None)
    monkeypatch.delenv("TORCH_NCCL_ASYNC_ERROR_HANDLING", raising=False)
    for k, v in {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "2",
                 "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29999"}.items():  # fmt: skip
        monkeypatch.setenv(k, v)
    opts = tiny_opts(tmp_path, tmp_path / "out", **{"DIST.TIMEOUT_MINUTES": 3})
    args = argument_parser("t").parse_args(["--config-file", DEMO_CONFIG, *opts])
    setup(args)
    assert seen["timeout"] == timedelta(minutes=3)
    assert seen["backend"] == "gloo" and seen["world_size"] == 2
    assert seen["env"] == "1"


def test_the_tool_passes_the_timeout_to_detectron2_launch(tmp_path, monkeypatch):
    import pretrain.cli.launching
    import pretrain.cli.train_pretrain as tool

    seen = {}
    monkeypatch.setattr(pretrain.cli.launching, "launch", lambda *a, **kw: seen.update(kw))
    monkeypatch.delenv("TORCH_NCCL_ASYNC_ERROR_HANDLING", raising=False)
    opts = tiny_opts(tmp_path, tmp_path / "out", **{"DIST.TIMEOUT_MINUTES": 4})
    assert tool.main(["--config-file", DEMO_CONFIG, "--num-gpus", "2", *opts]) == 0
    assert seen["timeout"] == timedelta(minutes=4)
    assert os.environ["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "1"  # launch's workers inherit it


# -- 3. one live run per OUTPUT_DIR --------------------------------------------------------------

_HOLDER = textwrap.dedent(
    """
    import os, sys, time
    from pretrain.utils.locks import DirLock
    DirLock(sys.argv[1], filename=sys.argv[3]).acquire()
    forked = sys.argv[2] == "fork" and os.fork() == 0  # a child (a data worker) that outlives us
    if sys.argv[2] != "fork" or forked:  # with a child, it says ready: it has started
        print("ready", flush=True)
    time.sleep(120)
    os._exit(0)
    """
)


def _hold(directory: Path, mode: str = "", filename: str = ".lock") -> subprocess.Popen:
    """A process holding ``directory``'s lock (and, with mode "fork", a forked child of it)."""
    p = subprocess.Popen(
        [sys.executable, "-c", _HOLDER, str(directory), mode or "-", filename],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        start_new_session=True,
    )
    assert p.stdout.readline().strip() == "ready"
    return p


def test_second_run_into_a_held_output_dir_refuses_and_a_killed_holder_frees_it(
    tmp_path, image_folder
):
    out = tmp_path / "run"
    holder = _hold(out)
    try:
        opts = tiny_opts(image_folder, out, **{"SOLVER.MAX_ITER": 2})
        refused = _tool(*opts)
        assert refused.returncode == 2, refused.stderr
        (line,) = _error_lines(refused.stderr)
        assert f"OUTPUT_DIR {out}" in line
        assert f"pid {holder.pid} on {socket.gethostname()}" in line
        # refused before writing anything: the live run's log and config are untouched
        assert sorted(os.listdir(out)) == [".lock"]
    finally:
        os.killpg(holder.pid, signal.SIGKILL)
        holder.wait()
    ran = _tool(*opts)  # the killed run's lock went with it
    assert ran.returncode == 0, ran.stderr
    assert (out / "model_final.pth").exists()
    assert (out / ".lock").read_text().startswith("pid ")


def test_lock_refuses_a_second_process_and_names_dir_and_holder(tmp_path):
    from pretrain.utils.errors import BusyError, LoracError
    from pretrain.utils.locks import DirLock, exclusive_dir_lock

    class StudyLikeError(LoracError):
        pass

    holder = _hold(tmp_path)
    try:
        with pytest.raises(BusyError) as e:
            DirLock(str(tmp_path)).acquire()
        msg = str(e.value)
        assert f"OUTPUT_DIR {tmp_path}:" in msg and f"pid {holder.pid} on " in msg
        with DirLock(str(tmp_path), filename=".other.lock") as other:  # another file: free
            assert other.held
    finally:
        os.killpg(holder.pid, signal.SIGKILL)
        holder.wait()
    # the study's use (transfer/study/driver.py): its own file, wording and error class
    holder = _hold(tmp_path, filename=".study.lock")
    try:
        study = exclusive_dir_lock(
            str(tmp_path), "--output-dir", "study", ".study.lock", StudyLikeError
        )
        busy = rf"--output-dir {tmp_path}: another study is running there \(pid {holder.pid} on "
        with pytest.raises(StudyLikeError, match=busy):
            study.acquire()
    finally:
        os.killpg(holder.pid, signal.SIGKILL)
        holder.wait()
    with DirLock(str(tmp_path)) as lock:
        assert lock.held
    assert not lock.held


def test_forked_child_of_a_killed_holder_does_not_keep_the_lock(tmp_path):
    """Data workers are forked children: after the run is killed they may live on a few seconds,
    and must not hold its OUTPUT_DIR meanwhile."""
    from pretrain.utils.locks import DirLock

    holder = _hold(tmp_path, "fork")
    os.kill(holder.pid, signal.SIGKILL)
    holder.wait()
    try:
        with pytest.raises(ProcessLookupError):
            os.kill(holder.pid, 0)
        os.killpg(holder.pid, 0)  # the forked child is still alive...
        with DirLock(str(tmp_path)) as lock:  # ...and does not hold the lock
            assert lock.held
    finally:
        os.killpg(holder.pid, signal.SIGKILL)


def test_file_system_without_flock_warns_and_runs_unlocked(tmp_path, monkeypatch, caplog):
    """Lustre without ``-o flock`` answers ENOLCK/ENOSYS: a lock that cannot exist must not stop
    the run; the warning says what is not protected."""
    import errno

    import pretrain.utils.locks as locks

    def no_flock(f, op):
        raise OSError(errno.ENOLCK, os.strerror(errno.ENOLCK))

    monkeypatch.setattr(locks.fcntl, "flock", no_flock)
    with caplog.at_level("WARNING"):
        lock = locks.DirLock(str(tmp_path)).acquire()
    assert not lock.held
    assert (
        f"cannot lock {tmp_path / '.lock'}" in caplog.text and "would not be refused" in caplog.text
    )


def test_lock_is_reentrant_in_one_process_and_released_with_the_trainer(tmp_path, image_folder):
    """A resumed run in the same process (the study, tests) is not a second user; the lock goes
    when the trainer does, so another process can then take the directory."""
    import gc

    from pretrain.engine.trainer import PretrainTrainer

    out = tmp_path / "run"
    cfg = load_config(DEMO_CONFIG, tiny_opts(image_folder, out))
    first = PretrainTrainer(cfg)
    second = PretrainTrainer(cfg)
    assert first.output_lock.held and second.output_lock.held
    probe = [sys.executable, "-c", "import sys; from pretrain.utils.locks import DirLock; "
             "DirLock(sys.argv[1]).acquire()", str(out)]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    assert subprocess.run(probe, env=env, capture_output=True).returncode != 0
    del first, second
    gc.collect()
    assert subprocess.run(probe, env=env, capture_output=True).returncode == 0


# -- 4. /dev/shm smaller than the loaders need ---------------------------------------------------

_Usage = namedtuple("_Usage", "total used free")


def test_small_dev_shm_is_reported_with_both_figures(tmp_path, monkeypatch, caplog):
    import pretrain.data.loader as loader

    views = {"INPUT.LARGE_CROPS": 3, "INPUT.SMALL_CROPS": 2, "DATALOADER.NUM_WORKERS": 2}
    cfg = load_config(DEMO_CONFIG, tiny_opts(tmp_path, tmp_path / "out", **views))
    # 1 process x 2 workers x 4 prefetched batches x 8 images x uint8 views (3 x 32^2 + 2 x 16^2)
    need = 2 * 4 * 8 * 3 * (3 * 32**2 + 2 * 16**2)
    assert loader.shared_memory_need(cfg, 1) == need
    assert loader.shared_memory_need(cfg, 2, procs_on_machine=2) == need  # half batch, 2 procs
    shm = tmp_path / "shm"
    shm.mkdir()
    monkeypatch.setattr(loader.shutil, "disk_usage", lambda p: _Usage(2**19, 0, 2**19))
    with caplog.at_level("WARNING"):
        msg = loader.check_shared_memory(cfg, 1, shm=str(shm))
    assert msg in caplog.text
    assert f"{shm} holds 0.5 MiB" in msg and "need about 0.7 MiB" in msg  # 688128 bytes
    assert "DATALOADER.NUM_WORKERS" in msg
    monkeypatch.setattr(loader.shutil, "disk_usage", lambda p: _Usage(need, 0, need))
    assert loader.check_shared_memory(cfg, 1, shm=str(shm)) is None  # large enough
    assert loader.check_shared_memory(cfg, 1, shm=str(tmp_path / "none")) is None  # no /dev/shm
    cfg0 = load_config(DEMO_CONFIG, tiny_opts(tmp_path, tmp_path / "out"))  # no workers
    assert loader.check_shared_memory(cfg0, 1, shm=str(shm)) is None


def test_training_start_checks_dev_shm(tmp_path, image_folder, monkeypatch, caplog):
    import pretrain.data.loader as loader
    from pretrain.engine.trainer import PretrainTrainer

    if not os.path.isdir("/dev/shm"):
        pytest.skip("no /dev/shm here")
    monkeypatch.setattr(loader.shutil, "disk_usage", lambda p: _Usage(2**20, 0, 2**20))
    opts = {"DATALOADER.NUM_WORKERS": 1, "INPUT.LARGE_SIZE": 64, "SOLVER.MAX_ITER": 1}
    trainer = PretrainTrainer(load_config(DEMO_CONFIG, tiny_opts(image_folder, tmp_path, **opts)))
    with caplog.at_level("WARNING"):
        trainer.train()
    assert "/dev/shm holds 1.0 MiB but the data loaders need about 1.1 MiB" in caplog.text  # 1.125
