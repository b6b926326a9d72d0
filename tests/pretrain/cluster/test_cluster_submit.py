"""tools/submit_pretrain.py (pretrain.cli.submit_pretrain) without a cluster: --dry-run output and
one-line refusals."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from pretrain.cli.submit_pretrain import main as CLI
from tests.helpers import tiny_opts
from tests.helpers.mistakes import assert_user_error, run_main, snapshot
from transfer.classification.demo import DEMO_CONFIG


def _fake_bin(tmp_path: Path, **scripts: str) -> Path:
    """Executables named after the keywords (e.g. sbatch=...), each recording that it ran."""
    d = tmp_path / "bin"
    d.mkdir(exist_ok=True)
    for name, body in scripts.items():
        exe = d / name
        exe.write_text(f'#!/bin/sh\necho {name} "$@" >> {d}/calls\n{body}\n')
        exe.chmod(0o755)
    return d


def _refused(argv: list[str]) -> None:
    """The tool ends with exit status 2, as for every user error."""
    with pytest.raises(SystemExit) as e:
        CLI(argv)
    assert e.value.code == 2


def _opts(tmp_path: Path, **extra) -> list[str]:
    (tmp_path / "data").mkdir(exist_ok=True)  # a submission checks DATASETS.ROOT is there
    return tiny_opts(tmp_path / "data", tmp_path / "out", **extra)


def test_dry_run_prints_sbatch_script_and_resolved_config(tmp_path, capsys, monkeypatch):
    """Every resource flag reaches the sbatch script; nothing is submitted; the config is the
    one the job will run (with MODEL.DEVICE cpu for --gpus-per-node 0)."""
    fake = _fake_bin(tmp_path, sbatch="exit 1", srun="exit 1")
    monkeypatch.setenv("PATH", f"{fake}:/usr/bin:/bin")
    argv = ["--config-file", DEMO_CONFIG, "--nodes", "2", "--gpus-per-node", "0",
            "--tasks-per-node", "2", "--partition", "cpu", "--timeout", "90", "--mem", "64",
            "--account", "proj", "--qos", "high", "--constraint", "avx512", "--cpus-per-task",
            "3", "--dry-run", *_opts(tmp_path, **{"MODEL.DEVICE": "cuda"})]  # fmt: skip
    assert CLI(argv) == 0
    out = capsys.readouterr().out
    script, config = out.split("# resolved config")
    for line in ["#SBATCH --nodes=2", "#SBATCH --ntasks-per-node=2", "#SBATCH --partition=cpu",
                 "#SBATCH --time=90", "#SBATCH --mem=65536MB", "#SBATCH --account=proj",
                 "#SBATCH --qos=high", "#SBATCH --constraint=avx512",
                 "#SBATCH --cpus-per-task=3", "#SBATCH --requeue",
                 "#SBATCH --signal=USR2@120"]:  # fmt: skip
        assert line in script.splitlines(), line
    assert "gpus-per-node" not in script
    assert "srun " in script and "-m submitit.core._submit " in script
    assert str(tmp_path / "out" / "submitit") in script  # default job folder: OUTPUT_DIR/submitit
    assert "  DEVICE: cpu" in config and "  IMS_PER_BATCH: 8" in config
    assert not (fake / "calls").exists()  # neither sbatch nor srun ran


def test_dry_run_gpu_job_defaults_cpus_to_data_workers(tmp_path, capsys):
    argv = ["--config-file", DEMO_CONFIG, "--nodes", "1", "--gpus-per-node", "4", "--dry-run",
            *_opts(tmp_path, **{"MODEL.DEVICE": "cuda", "DATALOADER.NUM_WORKERS": 5})]  # fmt: skip
    assert CLI(argv) == 0
    script = capsys.readouterr().out.split("# resolved config")[0].splitlines()
    assert "#SBATCH --gpus-per-node=4" in script and "#SBATCH --ntasks-per-node=4" in script
    assert "#SBATCH --cpus-per-task=6" in script  # 5 workers + the training process


def test_dry_run_tool_entry_shows_the_per_node_launch(tmp_path, capsys):
    """Evaluation tools and train_net: one task per node running detectron2's launch."""
    argv = ["--entry", "train_net", "--nodes", "2", "--gpus-per-node", "8", "--dry-run",
            "--config-file", "configs/x.yaml", "--job-dir", str(tmp_path), "MODEL.WEIGHTS",
            "w.pkl"]  # fmt: skip
    assert CLI(argv) == 0
    out = capsys.readouterr().out
    assert "#SBATCH --ntasks-per-node=1" in out and "#SBATCH --gpus-per-node=8" in out
    # the launch flags before the tool's arguments: after its overrides they would be read as one
    assert ("-m transfer.cli.train_net --num-gpus 8 --num-machines 2 --machine-rank <node id> "
            "--dist-url tcp://<first node>:<port from job id> --config-file configs/x.yaml "
            "MODEL.WEIGHTS w.pkl") in out  # fmt: skip


@pytest.mark.parametrize(
    "flags,message",
    [
        (["--nodes", "0"], "--nodes must be >= 1, got 0"),
        (["--gpus-per-node", "-1"], "--gpus-per-node must be >= 0, got -1"),
        (["--timeout", "0"], "--timeout must be >= 1, got 0"),
        (["--gpus-per-node", "0", "--tasks-per-node", "0"], "--tasks-per-node must be >= 1"),
        (["--cpus-per-task", "-2"], "--cpus-per-task must be >= 1, got -2"),
        (["--mem", "-4"], r"--mem must be > 0 \(GB\), got -4.0"),
        (["--gpus-per-node", "2", "--tasks-per-node", "3"], "one process per GPU"),
        (["--timeout", "2", "--signal-delay", "120"], "is not shorter than --timeout 2 min"),
        (["--local", "--nodes", "2"], "--local runs on this machine: --nodes must be 1"),
        (["--gpus-per-node", "0", "--tasks-per-node", "3"],
         r"SOLVER.IMS_PER_BATCH = 8: must be divisible by the number of processes \(3\)"),
        (["--gpus-per-node", "2"], "--gpus-per-node 2 but MODEL.DEVICE is cpu"),
        (["--gpus-per-node", "0", "--bogus"], "unrecognized option --bogus"),
        (["--gpu-per-node", "0"], "--gpu-per-node; did you mean --gpus-per-node"),
        (["--gpus-per-node", "0", "SOLVER.NO_SUCH_KEY", "1"], "config: .*SOLVER.NO_SUCH_KEY"),
    ],
)  # fmt: skip
def test_impossible_requests_are_one_line_errors(tmp_path, capsys, flags, message):
    argv = ["--config-file", DEMO_CONFIG, "--dry-run", *flags, *_opts(tmp_path)]
    _refused(argv)
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: "), err
    assert re.search(message, err), err


def test_missing_config_file_for_pretraining(capsys):
    _refused(["--dry-run"])
    assert capsys.readouterr().err == "error: --entry pretrain needs --config-file\n"


def test_sbatch_rejection_is_reported_in_one_line(tmp_path, capsys, monkeypatch):
    """What sbatch says when SLURM refuses the job (here: a partition it does not know) becomes
    the single error line; submitit's own echo of sbatch's stderr is not shown as well."""
    fake = _fake_bin(
        tmp_path, srun="exit 0",
        sbatch="echo 'sbatch: error: invalid partition specified: nope' >&2; exit 1",
    )  # fmt: skip
    monkeypatch.setenv("PATH", f"{fake}:/usr/bin:/bin")
    argv = ["--config-file", DEMO_CONFIG, "--gpus-per-node", "0", "--partition", "nope",
            *_opts(tmp_path)]  # fmt: skip
    _refused(argv)
    err = capsys.readouterr().err
    assert err == "error: sbatch rejected the job: invalid partition specified: nope\n"
    assert (fake / "calls").read_text().startswith("sbatch ")


def test_sbatch_without_a_reachable_cluster_names_the_fix_and_leaves_nothing(
    tmp_path, capsys, monkeypatch
):
    """sbatch installed, no controller answering (SLURM's own words, exit 1): one line naming
    sinfo and the local run, and neither OUTPUT_DIR nor submitit's pickle or script left."""
    fake = _fake_bin(
        tmp_path, srun="exit 0", squeue="exit 1",
        sbatch="echo 'sbatch: error: Batch job submission failed: Unable to contact slurm "
               "controller (connect failure)' >&2; exit 1",
    )  # fmt: skip
    monkeypatch.setenv("PATH", f"{fake}:/usr/bin:/bin")
    argv = ["--config-file", DEMO_CONFIG, "--gpus-per-node", "0", *_opts(tmp_path)]
    roots = (tmp_path / "data", tmp_path / "out")  # not bin/, where the fakes log their calls
    before = snapshot(*roots)
    result = run_main(CLI, argv)
    assert_user_error(result, before, *roots, match="could not reach a SLURM cluster")
    assert "sinfo" in result.stderr and "--local" in result.stderr
    assert (fake / "calls").read_text().splitlines()[-1].startswith("sbatch ")


def test_submitting_without_slurm_says_so(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("PATH", str(_fake_bin(tmp_path)))  # no srun, no sbatch
    argv = ["--config-file", DEMO_CONFIG, "--gpus-per-node", "0", *_opts(tmp_path)]
    _refused(argv)
    assert "no SLURM here (srun not found): use --local" in capsys.readouterr().err


def test_tool_job_passes_launch_flags_and_resumes_when_requeued(tmp_path, monkeypatch):
    """A tool entry runs the tool's module (python -m) with detectron2's multi-machine flags (here
    through submitit's local executor: one node, master 127.0.0.1); its requeued copy adds
    --resume."""
    import submitit

    from pretrain.cluster.jobs import ToolJob

    (tmp_path / "fake_lorac_tool.py").write_text(
        f"import sys\nopen({str(tmp_path / 'argv')!r}, 'w').write(' '.join(sys.argv[1:]))\n"
    )
    monkeypatch.setenv(
        "PYTHONPATH", os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])
    )
    job = ToolJob("fake_lorac_tool", ["--config-file", "c.yaml"], procs_per_node=2)
    ex = submitit.LocalExecutor(folder=str(tmp_path / "submitit"))
    assert ex.submit(job).result() == 0
    argv = (tmp_path / "argv").read_text()
    assert re.fullmatch(r"--num-gpus 2 --num-machines 1 --machine-rank 0 --dist-url "
                        r"tcp://127\.0\.0\.1:\d+ --config-file c.yaml", argv), argv  # fmt: skip
    again = job.checkpoint().function
    assert again.argv == ["--resume", "--config-file", "c.yaml"]
    assert again.checkpoint().function.argv == again.argv  # added once


def test_a_second_job_into_a_queued_run_is_refused_until_that_job_ended(tmp_path, monkeypatch):
    """A pretraining submission whose OUTPUT_DIR/submitit holds a job SLURM still lists ends in
    one error line naming that job, nothing submitted or written; once squeue no longer lists
    it (it ended), the same submission goes to sbatch."""
    fake = _fake_bin(
        tmp_path, srun="exit 0", squeue='echo "4242|PENDING"',
        sbatch='echo "Submitted batch job 4243"',
    )  # fmt: skip
    monkeypatch.setenv("PATH", f"{fake}:/usr/bin:/bin")
    argv = ["--config-file", DEMO_CONFIG, "--gpus-per-node", "0", *_opts(tmp_path)]
    (tmp_path / "out" / "submitit" / "4242").mkdir(parents=True)  # the earlier job's folder
    before = snapshot(tmp_path / "out")
    result = run_main(CLI, argv)
    assert_user_error(result, before, tmp_path / "out", match="holds job 4242, still pending")
    assert "scancel 4242" in result.stderr
    assert "sbatch" not in (fake / "calls").read_text()
    # only this user's jobs are asked for, not a whole cluster's queue
    assert f"squeue --noheader --format=%i|%T --user={os.getuid()}" in (fake / "calls").read_text()
    (fake / "squeue").write_text("#!/bin/sh\necho 'Invalid job id specified' >&2\nexit 1\n")
    assert run_main(CLI, argv).returncode == 0
    assert (fake / "calls").read_text().splitlines()[-1].startswith("sbatch ")
