"""`tools/study.py --executor slurm` without a cluster: `--dry-run` prints every job's sbatch
script with its dependencies and writes nothing; `--status` shows every run's state of a
half-finished experiment (a fake `squeue` stands in for SLURM's queue)."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

from tests.helpers import tiny_opts
from tests.helpers.analysis import exit_status, make_fashion_mnist
from tests.helpers.mistakes import snapshot
from transfer.cli.study import main as study_main
from transfer.study.experiments import IN100_BETAS
from transfer.study.slurm import LEDGER


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


def _fake_squeue(bin_dir: Path, lines: list[str]) -> None:
    bin_dir.mkdir()
    script = bin_dir / "squeue"
    script.write_text("#!/bin/sh\n" + "".join(f"echo '{line}'\n" for line in lines))
    script.chmod(0o755)


def test_status_of_a_half_finished_experiment_shows_every_run(tmp_path, monkeypatch, capsys):
    """Four runs: one done, one training (job in the queue), one whose job failed (not in the
    queue, no result: its log is named), one never submitted. Nothing is submitted."""
    root = make_fashion_mnist(tmp_path / "fm", n_train=40, n_test=20)
    out = tmp_path / "exp"
    methods = ["lorac_beta0.5", "lorac_beta1", "lorac_beta2", "lorac_beta4"]
    (out / "lorac_beta0.5_seed0").mkdir(parents=True)
    done = {"max_iter": 6, "linear_top1": 71.25, "method": "lorac_beta0.5", "seed": 0}
    (out / "lorac_beta0.5_seed0" / "study.json").write_text(json.dumps(done))
    (out / "lorac_beta1_seed0").mkdir()
    metrics = [{"iteration": 2, "total_loss": 5.5}, {"iteration": 3, "total_loss": 5.25}]
    (out / "lorac_beta1_seed0" / "metrics.json").write_text(
        "".join(json.dumps(m) + "\n" for m in metrics)
    )
    ledger = {
        "lorac_beta0.5_seed0": {"pretrain": "100", "evaluate": "101"},
        "lorac_beta1_seed0": {"pretrain": "102", "evaluate": "103"},
        "lorac_beta2_seed0": {"pretrain": "104", "evaluate": "105"},
    }
    (out / LEDGER).write_text(json.dumps(ledger))
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


def test_an_imagenet_experiment_page_shows_the_runs_done_and_names_the_missing(tmp_path):
    """in100-priors with 2 seeds, three runs probed: means over the seeds that are done, each
    method's count of seeds, and every missing run named; nothing averaged silently."""
    from pretrain.cluster.submit import JobRequest
    from transfer.cli.study import parse_args, study_options
    from transfer.study.config import load_experiment_configs
    from transfer.study.experiments import EXPERIMENTS
    from transfer.study.slurm import plan_runs, run_states
    from transfer.study.slurm_driver import write_page

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
    states = run_states(planned, opt.output_dir)
    assert [s.state for s in states] == ["done", "done", "done", "not started"]
    write_page(exp, opt, states)
    page = (tmp_path / "exp" / "results.md").read_text()
    assert "| LORAC | 2/2 | 71.00 ± 0.71 | 0: 70.50, 1: 71.50 |" in page
    assert "| MoCo-M | 1/2 | 69.00 ± n/a | 0: 69.00 |" in page
    assert "## Missing runs (1)" in page and "- MoCo-M seed 1 (`mocom_seed1`): not started" in page
