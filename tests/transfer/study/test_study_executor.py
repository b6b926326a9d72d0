"""`tools/study.py --executor slurm` without a cluster: `--dry-run` prints every job's sbatch
script with its dependencies and writes nothing; `--status` shows every run's state of a
half-finished experiment (a fake `squeue` stands in for SLURM's queue, a fake `sbatch` for its
submissions); the `--status` line a submission prints runs as printed."""

from __future__ import annotations

import json
import os
import re
import shlex
from pathlib import Path

import pytest

from tests.helpers import tiny_opts
from tests.helpers.analysis import exit_status, make_fashion_mnist, study_record
from tests.helpers.mistakes import snapshot
from transfer.cli.study import main as study_main
from transfer.study.experiments import IN100_BETAS


def _blocks(text: str) -> dict[str, str]:
    """``{"<run>:pretrain" or "<run>:evaluate": that job's sbatch script and command}``."""
    parts = re.split(r"^##### (\S+):(pretrain|evaluate)\b.*$", text, flags=re.M)
    return {f"{parts[i]}:{parts[i + 1]}": parts[i + 2] for i in range(1, len(parts), 3)}


def test_dry_run_of_in100_beta_prints_a_job_per_run_and_a_dependent_evaluation(
    tmp_path, monkeypatch, capsys
):
    monkeypatch.chdir(tmp_path)
    before = snapshot(tmp_path)
    argv = ["--experiment", "in100-beta", "--seeds", "0", "1", "--dry-run", "--partition", "gpu"]
    assert exit_status(study_main, [*argv, "DATASETS.ROOT", "/data/imagenet/train"]) == 0
    assert snapshot(tmp_path) == before  # nothing written, nothing submitted
    jobs = _blocks(capsys.readouterr().out)
    runs = [f"lorac_beta{b:g}_seed{s}" for b in IN100_BETAS for s in (0, 1)]
    runs += ["mocom_seed0", "mocom_seed1"]
    assert sorted(jobs) == sorted(f"{r}:{j}" for r in runs for j in ("pretrain", "evaluate"))
    assert len(runs) == 14  # 6 values of beta and MoCo-M (beta = inf), 2 seeds
    for run in runs:
        beta = run.split("_seed")[0].removeprefix("lorac_beta")
        pre, ev = jobs[f"{run}:pretrain"], jobs[f"{run}:evaluate"]
        # pretraining: one job per (beta, seed), requeued on the time-limit signal, no dependency
        assert "--dependency" not in pre and "#SBATCH --requeue" in pre
        assert "#SBATCH --signal=USR2@120" in pre and "#SBATCH --partition=gpu" in pre
        assert "#SBATCH --gpus-per-node=4" in pre and "#SBATCH --ntasks-per-node=4" in pre
        seed = run.rsplit("seed", 1)[1]
        assert f"SEED: {seed}\n" in pre and "EPOCHS: 100.0" in pre
        if run.startswith("lorac"):
            assert re.search(rf"^  BETA: {float(beta)}$", pre, re.M), run
        else:
            assert "PRIOR: none" in pre
        # evaluation: after its own checkpoint's job only, cancelled when that one fails
        deps = re.findall(r"^#SBATCH --dependency='(.*)'$", ev, re.M)
        assert deps == [f"afterok:{{job of {run}:pretrain}}"], ev
        assert "#SBATCH --kill-on-invalid-dep=yes" in ev
        assert "-m transfer.cli.linear_probe" in ev
        assert f"{run}/model_final.pth" in ev and "--data-root /data/imagenet " in ev
        # on the 100 classes the run pretrained on, not all of ImageNet-1K's; the launch flags
        # before the overrides (after them they would be read as overrides)
        assert re.search(r"--dist-url tcp://.* --config-file .* DATA\.CLASS_LIST imagenet100\n", ev)


def _fake_squeue(bin_dir: Path, lines: list[str]) -> None:
    bin_dir.mkdir()
    script = bin_dir / "squeue"
    script.write_text("#!/bin/sh\n" + "".join(f"echo '{line}'\n" for line in lines))
    script.chmod(0o755)


def test_status_of_a_half_finished_experiment_shows_every_run(tmp_path, monkeypatch, capsys):
    """Five runs: one done, one training (job in the queue), one whose job failed (not in the
    queue, no result: its log is named), one never submitted, and one trained again whose
    evaluation job, refused, is missing: its evaluation job older than that pretraining evaluated
    nothing of it and is not its failure. Nothing is submitted."""
    root = make_fashion_mnist(tmp_path / "fm", n_train=40, n_test=20)
    out = tmp_path / "exp"
    methods = ["lorac_beta0.5", "lorac_beta1", "lorac_beta2", "lorac_beta4", "lorac_beta8"]
    (out / "lorac_beta0.5_seed0").mkdir(parents=True)
    done = {"max_iter": 6, "linear_top1": 71.25, "method": "lorac_beta0.5", "seed": 0}
    (out / "lorac_beta0.5_seed0" / "study.json").write_text(json.dumps(done))
    (out / "lorac_beta1_seed0").mkdir()
    metrics = [{"iteration": 2, "total_loss": 5.5}, {"iteration": 3, "total_loss": 5.25}]
    (out / "lorac_beta1_seed0" / "metrics.json").write_text(
        "".join(json.dumps(m) + "\n" for m in metrics)
    )
    # the job folders submitit wrote: <run>/submitit/<pretraining job>, .../evaluate/<its eval>
    for run, pretrain, evaluate in [("lorac_beta0.5_seed0", "100", "101"),
                                    ("lorac_beta1_seed0", "102", "103"),
                                    ("lorac_beta2_seed0", "104", "105"),
                                    ("lorac_beta8_seed0", "107", "106")]:  # fmt: skip
        (out / run / "submitit" / "evaluate" / evaluate).mkdir(parents=True)
        (out / run / "submitit" / pretrain).mkdir()
    (out / "lorac_beta8_seed0" / "model_final.pth").write_bytes(b"")
    _fake_squeue(tmp_path / "bin", ["102|RUNNING", "103|PENDING", "99|RUNNING"])
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:{os.environ['PATH']}")
    before = snapshot(out)
    opts = tiny_opts(root, out, **{"DATASETS.TYPE": "fashion_mnist"})
    argv = ["--experiment", "study-beta", "--output-dir", str(out), "--seeds", "0", "--methods",
            *methods, "--status", *opts]  # fmt: skip
    assert exit_status(study_main, argv) == 0
    assert snapshot(out) == before
    rows = {
        cells[0]: cells[1:]
        for line in capsys.readouterr().out.splitlines()
        if line.startswith("|") and (cells := [c.strip() for c in line.strip("|").split("|")])
    }
    assert rows["lorac_beta0.5_seed0"] == ["done", "101", "6", "linear 71.25%"]
    assert rows["lorac_beta1_seed0"] == ["pretraining: RUNNING", "102", "3", "loss 5.2500"]
    log = out / "lorac_beta2_seed0" / "submitit" / "104" / "104_0_log.err"
    assert rows["lorac_beta2_seed0"] == ["failed (log " + str(log) + ")", "104", "-", "-"]
    assert rows["lorac_beta4_seed0"] == ["not started", "-", "-", "-"]
    assert rows["lorac_beta8_seed0"] == ["stopped, resumes", "-", "-", "-"]


def test_an_imagenet_experiment_page_shows_the_runs_done_and_names_the_missing(tmp_path):
    """in100-priors with 2 seeds, three runs probed: means over the seeds that are done, each
    method's count of seeds, and every missing run named; nothing averaged silently."""
    from pretrain.cluster.submit import JobRequest
    from transfer.cli.study import parse_args, study_options
    from transfer.study.config import load_experiment_configs
    from transfer.study.experiments import EXPERIMENTS
    from transfer.study.slurm import plan_runs, run_states, write_page

    exp = EXPERIMENTS["in100-priors"]
    argv = ["--output-dir", str(tmp_path / "exp"), "--seeds", "0", "1", "--methods", "lorac",
            "mocom", "--jobs", "1", "DATASETS.ROOT", "/data/in/train"]  # fmt: skip
    args = parse_args(argv)
    opt = study_options(args, exp, "python tools/study.py (test)")
    planned = plan_runs(exp, opt, load_experiment_configs(exp, opt), JobRequest())
    for run, top1 in (("lorac_seed0", "70.50"), ("lorac_seed1", "71.50"), ("mocom_seed0", "69.00")):
        probe = tmp_path / "exp" / run / "linear"
        probe.mkdir(parents=True)
        (probe / "table1_linear.csv").write_text(f"Method,Top-1,Top-5\nx,{top1},90.00\n")
    states = run_states(planned)
    assert [s.state for s in states] == ["done", "done", "done", "not started"]
    write_page(exp, opt, states)
    page = (tmp_path / "exp" / "results.md").read_text()
    assert "| LORAC | 2/2 | 71.00 ± 0.71 | 0: 70.50, 1: 71.50 |" in page
    assert "| MoCo-M | 1/2 | 69.00 ± n/a | 0: 69.00 |" in page
    assert "## Missing runs (1)" in page and "- MoCo-M seed 1 (`mocom_seed1`): not started" in page


def _fake_slurm(bin_dir: Path, refuse: int = 0) -> Path:
    """``sbatch`` that numbers the jobs 1, 2, ... and lists each as PENDING for ``squeue``
    (refusing the ``refuse``-th submission, as SLURM refuses a job), and an ``srun``."""
    bin_dir.mkdir()
    scripts = {
        "sbatch": f"""n=$(( $(cat {bin_dir}/count 2>/dev/null || echo 0) + 1 ))
echo $n > {bin_dir}/count
if [ $n = {refuse} ]; then echo "sbatch: error: invalid account" >&2; exit 1; fi
echo "$n|PENDING" >> {bin_dir}/queue
echo "Submitted batch job $n"
""",
        "squeue": f"cat {bin_dir}/queue 2>/dev/null; exit 0\n",
        "srun": "exit 0\n",
    }
    for name, body in scripts.items():
        (bin_dir / name).write_text("#!/bin/sh\n" + body)
        (bin_dir / name).chmod(0o755)
    return bin_dir


def _status_rows(out: str) -> dict[str, list[str]]:
    return {
        cells[0]: cells[1:]
        for line in out.splitlines()
        if line.startswith("|") and (cells := [c.strip() for c in line.strip("|").split("|")])
    }


def _slurm_argv(tmp_path: Path, out: Path, methods: list[str]) -> list[str]:
    root = make_fashion_mnist(tmp_path / "fm", n_train=40, n_test=20)
    opts = tiny_opts(root, out, **{"DATASETS.TYPE": "fashion_mnist"})
    return ["--experiment", "study-beta", "--output-dir", str(out), "--seeds", "0", "--jobs", "1",
            "--executor", "slurm", "--methods", *methods, "--", *opts]  # fmt: skip


def test_the_printed_status_line_runs_and_the_page_shows_queued_runs_as_queued(
    tmp_path, monkeypatch, capsys
):
    """One run done, one submitted now (a fake sbatch; squeue lists its jobs as pending). The
    `--status` line the submission prints put `--status` after the overrides, where it was
    read as one more (exit 2); now it runs as printed and shows the new run's job. The page
    written with it named that run "not started"; now it names it queued, with its job."""
    out = tmp_path / "exp"
    argv = _slurm_argv(tmp_path, out, ["lorac_beta1", "lorac_beta2"])
    (out / "lorac_beta1_seed0").mkdir(parents=True)
    done = study_record("lorac_beta1", "LORAC β=1", 0, 80.0, 7.0)
    (out / "lorac_beta1_seed0" / "study.json").write_text(json.dumps(done))
    monkeypatch.setenv("PATH", f"{_fake_slurm(tmp_path / 'bin')}:/usr/bin:/bin")
    assert exit_status(study_main, argv) == 0
    printed = capsys.readouterr().out
    assert "lorac_beta2_seed0: submitted: pretrain job 1, evaluate job 2" in printed, printed
    # 6 iterations, the sweep's beta = inf for half of SOLVER.EPOCHS: said before the queue wait
    assert "warning: training ends at iteration 6" in printed and "β=2 at iteration 9" in printed
    page = (out / "results.md").read_text()
    assert "- LORAC β=2 seed 0 (`lorac_beta2_seed0`): pretraining: PENDING (job 1)" in page
    line = re.search(r"`(python tools/study\.py .*)` shows them", printed).group(1)
    command = shlex.split(line)
    assert command[:2] == ["python", "tools/study.py"]
    assert exit_status(study_main, command[2:]) == 0  # as a shell runs it, less the interpreter
    rows = _status_rows(capsys.readouterr().out)
    assert rows["lorac_beta1_seed0"] == ["done", "-", "10", "linear 81.00%"]
    assert rows["lorac_beta2_seed0"] == ["pretraining: PENDING", "1", "-", "-"]


def test_a_run_whose_evaluation_job_is_refused_shows_its_queued_pretraining(
    tmp_path, monkeypatch, capsys
):
    """sbatch takes a run's pretraining job and refuses its evaluation job: the run's queued
    job is in its submitit folder at once, so `--status` shows it queued (not "not started")
    and the next submission leaves it alone instead of submitting it a second time; once that
    job has trained the run, the next submission adds its evaluation job only."""
    out = tmp_path / "exp"
    argv = _slurm_argv(tmp_path, out, ["lorac_beta1"])
    monkeypatch.setenv("PATH", f"{_fake_slurm(tmp_path / 'bin', refuse=2)}:/usr/bin:/bin")
    assert exit_status(study_main, argv) == 2
    assert "error: sbatch rejected the job: invalid account" in capsys.readouterr().err
    at = argv.index("--")
    assert exit_status(study_main, [*argv[:at], "--status", *argv[at:]]) == 0
    rows = _status_rows(capsys.readouterr().out)
    assert rows["lorac_beta1_seed0"] == ["pretraining: PENDING", "1", "-", "-"]
    assert exit_status(study_main, argv) == 0
    assert "lorac_beta1_seed0: pretraining: PENDING (job 1), left alone" in capsys.readouterr().out
    # its pretraining ends well: the run is missing its evaluation only (not "failed")
    (tmp_path / "bin" / "queue").write_text("")
    (out / "lorac_beta1_seed0" / "model_final.pth").write_bytes(b"")
    assert exit_status(study_main, [*argv[:at], "--status", *argv[at:]]) == 0
    rows = _status_rows(capsys.readouterr().out)
    assert rows["lorac_beta1_seed0"][:2] == ["stopped, resumes", "-"]
    assert exit_status(study_main, argv) == 0
    assert (
        "lorac_beta1_seed0: submitted, resumes from its checkpoint, evaluation only (pretraining "
        "finished): evaluate job 3" in capsys.readouterr().out
    )


@pytest.mark.parametrize(
    "argv",
    [
        ["--seeds", "0", "--executor", "slurm", "SOLVER.MAX_ITER", "20"],
        ["--methods", "lorac", "--", "SOLVER.MAX_ITER", "20", "--status"],  # a flag as a value
        ["--executor", "slurm", "--methods", "lorac"],  # no overrides
    ],
)
def test_the_status_command_puts_status_before_the_overrides(argv):
    from transfer.cli.study import parse_args, status_command

    args = parse_args(argv)
    again = parse_args(shlex.split(status_command(argv, args.opts))[2:])
    assert again.status and again.opts == args.opts and again.methods == args.methods


def test_a_slurm_submission_refuses_runs_made_with_other_settings(tmp_path, monkeypatch, capsys):
    """As a local study: a finished run made with other overrides would be reused as if made
    with these and the page would mix the two; one error line names the difference, and
    nothing is submitted or written."""
    out = tmp_path / "exp"
    argv = _slurm_argv(tmp_path, out, ["lorac_beta1"])
    (out / "lorac_beta1_seed0").mkdir(parents=True)
    done = study_record("lorac_beta1", "LORAC β=1", 0, 80.0, 7.0, overrides=["LOSS.BETA", "3.0"])
    (out / "lorac_beta1_seed0" / "study.json").write_text(json.dumps(done))
    monkeypatch.setenv("PATH", f"{_fake_slurm(tmp_path / 'bin')}:/usr/bin:/bin")
    before = snapshot(out)
    assert exit_status(study_main, argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: --output-dir "), err
    assert "made with other settings: " in err[0] and "; LOSS.BETA 3.0 (now 1.0); " in err[0]
    assert snapshot(out) == before and not (tmp_path / "bin" / "count").exists()
