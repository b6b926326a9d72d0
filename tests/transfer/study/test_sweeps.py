"""The paper's two ablations as study sweeps (make study-beta, make study-views), and the run
records that let a sweep go on in another session."""

from __future__ import annotations

import json
import math
from datetime import datetime

from pretrain.modeling import build_model
from tests.helpers.analysis import assert_png_not_blank, make_fashion_mnist, study_record
from transfer.study import StudyOptions, run_study
from transfer.study.config import load_method_configs
from transfer.study.experiments import sweep_methods


def _options(tmp_path, sweep, root, **kw):
    table = sweep_methods(sweep, 2.0)
    return StudyOptions(
        output_dir=str(tmp_path / "out"),
        results=str(tmp_path / f"results_{sweep}.md"),
        seeds=(0, 1),
        methods=list(table),
        method_table=table,
        sweep=sweep,
        opts=("DATASETS.ROOT", str(root)),
        **kw,
    )


def test_beta_sweep_methods(tmp_path):
    """LORAC at five betas with beta = inf for the first half of the epochs, and MoCo-M."""
    root = make_fashion_mnist(tmp_path / "fm")
    opt = _options(tmp_path, "beta", root)
    cfgs = load_method_configs(opt)
    assert sorted(opt.method_table[m].x for m in cfgs) == [0.5, 1, 2, 4, 8, math.inf]
    for key, cfg in cfgs.items():
        if key == "mocom":
            assert cfg.LOSS.PRIOR == "none"
            continue
        assert opt.method_table[key].x == cfg.LOSS.BETA and cfg.LOSS.BETA_INF_EPOCHS == 1.0
        assert cfg.LOSS.PRIOR == "laplace"


def test_views_sweep_methods_have_m_views_and_m_row_q(tmp_path):
    """M views of one size, one key crop; LORAC's Q = the M - 1 queries and the key (M rows)."""
    root = make_fashion_mnist(tmp_path / "fm")
    opt = _options(tmp_path, "views", root)
    cfgs = load_method_configs(opt)
    assert len(cfgs) == 8
    for key, cfg in cfgs.items():
        m = opt.method_table[key].x
        assert (m, 0, 1) == (cfg.INPUT.LARGE_CROPS, cfg.INPUT.SMALL_CROPS, cfg.INPUT.KEY_CROPS)
        model = build_model(cfg)
        assert model.criterion.q_rows == m
        assert model.query_views == list(range(1, m))  # the same views for LORAC and MoCo-M
        if key.startswith("lorac"):
            assert cfg.LOSS.BETA == 1.0 and cfg.LOSS.BETA_INF_EPOCHS == 1.0
        else:
            assert cfg.LOSS.PRIOR == "none"


def test_records_are_not_run_again_and_make_the_sweep_report(tmp_path):
    """With every run's record present (as committed by an earlier session) nothing trains; the
    report states the sweep against the paper's curve shapes and draws its plots."""
    root = make_fashion_mnist(tmp_path / "fm")
    records = tmp_path / "records"
    records.mkdir()
    opt = _options(tmp_path, "beta", root, records=str(records))
    knn = {0.5: 70.0, 1.0: 74.0, 2.0: 76.0, 4.0: 75.0, 8.0: 74.5, math.inf: 74.0}
    for key, method in opt.method_table.items():
        for seed in opt.seeds:
            r = study_record(
                key, method.label, seed, knn[method.x] + 0.1 * seed, 5.0 + min(method.x, 16) / 10
            )
            (records / f"{key}_seed{seed}.json").write_text(json.dumps(r))
    outcomes = run_study(opt)
    assert {o.status for o in outcomes} == {"skipped"} and len(outcomes) == 12
    text = (tmp_path / "results_beta.md").read_text()
    assert "# CPU-scale β sweep" in text and "The paper (Fig. 3" in text
    assert "by `tools/study.py` (`make study-beta`)" in text
    assert "kNN is highest at β = 2 (76.05 %; the paper's peak is at β = 2)" in text
    assert "LORAC is above MoCo-M beyond the seed spread at β = 2, 4, 8" in text
    assert "below it beyond the seed spread at β = 0.5, within it at β = 1" in text
    assert "at β = 0.5 kNN is below MoCo-M's beyond the seed spread" in text
    assert "grows with β (as the paper's Fig. 3b)" in text
    assert "This invocation of the study ran nothing: every run was recorded" in text
    for name in ("results_beta.png", "results_beta_curves.png"):
        assert_png_not_blank(tmp_path / name)
    assert_png_not_blank(tmp_path / "results_beta_accuracy_vs_nuclear_norm.png")
    assert not (tmp_path / "out" / "lorac_beta2_seed0").exists()  # nothing trained


def test_a_finished_run_writes_its_record(tmp_path, monkeypatch):
    """A run's study.json goes to the records folder as soon as the run ends."""
    import transfer.study.driver as driver

    root = make_fashion_mnist(tmp_path / "fm", n_train=40, n_test=20)
    records = tmp_path / "records"
    table = sweep_methods("views", 2.0)
    opt = StudyOptions(
        output_dir=str(tmp_path / "out"),
        results=str(tmp_path / "r.md"),
        seeds=(0,),
        methods=["mocom_M2"],
        method_table=table,
        sweep="views",
        records=str(records),
        opts=("DATASETS.ROOT", str(root)),
    )
    fake = study_record("mocom_M2", "MoCo-M M=2", 0, 70.0, 5.0)
    monkeypatch.setattr(driver, "pretrain_run", lambda cfg, run: {})
    monkeypatch.setattr(driver, "evaluate_run", lambda cfg, run, opt: dict(fake))
    (outcome,) = run_study(opt)
    assert outcome.status == "done"
    saved = json.loads((records / "mocom_M2_seed0.json").read_text())
    assert saved["knn_top1"] == 70.0 and saved["overrides"][-2:] == [
        "LOSS.LOWRANK_VIEWS",
        "queries",
    ]


def test_invocations_are_logged_and_summed_on_the_page(tmp_path):
    """An invocation that ran something is appended to the records' invocations.json; one that
    ran nothing is not, and the page shows the sum over all of them."""
    from transfer.study.page import Invocation, render_page
    from transfer.study.records import INVOCATIONS, log_invocation

    opt = _options(tmp_path, "beta", tmp_path, records=str(tmp_path / "records"))
    assert log_invocation(opt, 600.0, 0) == []  # nothing ran, nothing logged
    assert not (tmp_path / "records" / INVOCATIONS).exists()
    log_invocation(opt, 59 * 60.0, 18)
    logged = log_invocation(opt, 30 * 60.0, 6)
    assert [(i["minutes"], i["runs_done"]) for i in logged] == [(59.0, 18), (30.0, 6)]
    on_disk = json.loads((tmp_path / "records" / INVOCATIONS).read_text())["invocations"]
    assert on_disk == logged
    results = [study_record("mocom", "MoCo-M", seed, 70.0, 5.0) for seed in opt.seeds]
    started = datetime(2026, 1, 1).isoformat()  # any start: the line sums the logged invocations
    page = render_page(opt, results, "p.png", Invocation(started, 0.0, 0, logged))
    (line,) = [ln for ln in page.splitlines() if ln.startswith("- Wall time of the target")]
    assert "89.0 min" in line and "59.0 min, 18 runs" in line and "30.0 min, 6 runs" in line
