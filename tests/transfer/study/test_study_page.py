"""The committed study pages (docs/results*.md) are a function of the committed records
(docs/results_runs/) and of what each page states about the invocation that wrote it (time,
command, machine): rendered again from those, every page comes out byte for byte."""

from __future__ import annotations

import dataclasses
import datetime
import re
import shlex

import pytest

from tests.helpers import ROOT
from transfer.cli.study import parse_args
from transfer.study.page import Invocation, render_page
from transfer.study.records import INVOCATIONS, load_records, read_json

# the "Generated" time of the pages these tests render; none of them reads it
STAMP = datetime.datetime(2026, 1, 1).isoformat()
PAGES = {
    "results.md": "study",
    "results_beta.md": "beta",
    "results_views.md": "views",
}


def _stated(page: str) -> tuple[list[str], Invocation]:
    """The command line and the invocation that the page says wrote it."""
    stamp = re.search(r"^Generated (\S+) by", page, re.M)[1]
    command = re.search(r"^## Command\n\n```\n(.*)\n```$", page, re.M)[1]
    hardware = page.split("## Hardware and wall time\n\n", 1)[1].splitlines()[:4]
    threads = int(re.search(r"each run had (\d+) torch thread", page)[1])
    minutes = re.search(r"This invocation of the study: ([\d.]+) min", page)
    invocation = Invocation(
        stamp=stamp,
        seconds=60 * float(minutes[1]) if minutes else 0.0,
        runs_done=None if minutes else 0,  # 0: "it rewrote this page from the records"
        machine=dict(line[2:].split(": ", 1) for line in hardware),
        threads_per_run=threads,
    )
    return shlex.split(command), invocation


@pytest.mark.parametrize("name", list(PAGES))
def test_committed_page_is_rendered_again_from_its_records(name, monkeypatch):
    """Everything but the stated invocation comes from the records: the sentences, every
    table, the budget and the wall times; one changed digit anywhere fails."""
    monkeypatch.chdir(ROOT)  # the page names the configs relative to the repository
    page = (ROOT / "docs" / name).read_text(encoding="utf-8")
    argv, invocation = _stated(page)
    assert argv[:2] == ["python", "tools/study.py"]
    args = parse_args(argv[2:])
    opt, results = load_records(f"docs/results_runs/{PAGES[name]}")
    opt = dataclasses.replace(opt, command=shlex.join(argv), jobs=args.jobs, opts=args.opts)
    logged = read_json(f"{opt.records}/{INVOCATIONS}")["invocations"]
    invocation = dataclasses.replace(invocation, logged=logged)
    png = f"docs/{name[:-3]}.png"
    assert render_page(opt, results, png, invocation) == page


def test_the_page_names_the_runs_whose_prior_never_turned_on():
    """A budget that ends before LOSS.BETA_INF_EPOCHS (a quick look) trains LORAC as MoCo-M: the
    page names those runs, so that their numbers, MoCo-M's own, are not read as a comparison;
    runs whose prior turned on, and records without `prior_on_iter`, add nothing."""
    from tests.helpers.analysis import study_record
    from transfer.study.experiments import StudyOptions
    from transfer.study.page import prior_never_on_section

    opt = StudyOptions(seeds=(0, 1), methods=("lorac", "mocom"))
    late = [study_record("lorac", "LORAC", s, 80.0, 6.0, prior_on_iter=64) for s in (0, 1)]
    mocom = [study_record("mocom", "MoCo-M", s, 80.0, 6.0, prior_on_iter=None) for s in (0, 1)]
    page = render_page(opt, late + mocom, "r.png", Invocation(STAMP, 1.0, 1))
    section = page.split("## The prior never turned on\n\n", 1)[1].split("\n## ", 1)[0]
    assert "MoCo-M in all but name" in section
    assert (
        "- LORAC (seeds 0, 1): training ended at iteration 10; the prior would have turned on "
        "at iteration 64." in section.splitlines()
    )
    assert "MoCo-M (" not in section  # it has no prior to turn on
    on_time = [dict(r, prior_on_iter=4) for r in late]
    assert prior_never_on_section(opt, on_time + mocom) == []
    older = [{k: v for k, v in r.items() if k != "prior_on_iter"} for r in late + mocom]
    assert prior_never_on_section(opt, older) == []


def _beta_sweep(seeds, knn, nuc, prior_on_iter=4):
    """A β sweep's records: LORAC at every β and MoCo-M; ``knn(x, seed)`` and ``nuc(x, seed)``
    give each run's numbers; LORAC's prior turns on at ``prior_on_iter`` (each run: 10 it.)."""
    from tests.helpers.analysis import study_record
    from transfer.study.experiments import StudyOptions, sweep_methods

    table = sweep_methods("beta", 2.0)
    results = [
        study_record(
            key,
            m.label,
            seed,
            knn(m.x, seed),
            nuc(m.x, seed),
            prior_on_iter=None if key == "mocom" else prior_on_iter,
        )
        for key, m in table.items()
        for seed in seeds
    ]
    opt = StudyOptions(seeds=tuple(seeds), methods=tuple(table), sweep="beta", method_table=table)
    return opt, results


NO_NAN = re.compile(r"\bnan\b", re.I)


@pytest.mark.parametrize(
    "case, seeds, knn, nuc, why",
    [
        ("tied", (0, 1), lambda x, s: 80.0 + s, lambda x, s: 6.0, "so no peak is read"),
        ("one seed", (0,), lambda x, s: 80 + min(x, 10) / 10, lambda x, s: 6 + x / 10, "one seed"),
    ],
)
def test_a_sweep_page_draws_no_conclusion_from_ties_or_one_seed(case, seeds, knn, nuc, why):
    """Tied means (every β equal) or a single seed per β: the page has no "highest at" and no
    "as the paper" sentence, says why no conclusion is drawn, and prints no NaN interval."""
    opt, results = _beta_sweep(seeds, knn, nuc)
    page = render_page(opt, results, "r.png", Invocation(STAMP, 1.0, 1))
    sweep = page.split("## The sweep\n\n", 1)[1].split("\n## ", 1)[0]
    assert "highest at" not in page and "as the paper" not in page, sweep
    assert why in sweep
    assert not NO_NAN.search(page), [line for line in page.splitlines() if NO_NAN.search(line)]
    if case == "one seed":
        assert "| -0.95 (one seed: no interval) |" in sweep  # β = 0.5: 80.05 - MoCo-M's 81.00


def test_a_run_whose_prior_never_turned_on_is_labelled_so_on_the_page_and_in_the_report():
    """The tester's quick look: one seed, LORAC's prior never on, so every row equals MoCo-M's.
    The page draws no conclusion about β; every table names those runs as never on (β = ∞),
    not by their configured β; the main study's comparison says LORAC trained MoCo-M's
    objective; the HTML report's study section (the same Comparison) says the same."""
    from tests.helpers.analysis import study_record
    from transfer.study.comparison import comparison
    from transfer.study.experiments import StudyOptions
    from transfer.study.stats import summarize

    opt, results = _beta_sweep((0,), lambda x, s: 80.0, lambda x, s: 6.0, prior_on_iter=64)
    page = render_page(opt, results, "r.png", Invocation(STAMP, 1.0, 1))
    assert "highest at" not in page and "as the paper" not in page
    assert not NO_NAN.search(page)
    assert (
        "no LORAC run turned its prior on (prior never on: β = ∞ throughout at β = 0.5, 1, 2, 4, 8)"
        in page
    )
    assert "| ∞ (prior never on; set 2) | 1 |" in page  # the sweep's β column
    never = "LORAC β=2 (prior never on: β = ∞ throughout)"
    assert f"| {never} | 1 |" in page  # the mean table
    assert f"| {never} | 0 |" in page  # the per-seed table
    assert not re.search(r"^\| LORAC β=2 \|", page, re.M)

    study = StudyOptions(seeds=(0, 1), methods=("lorac", "mocom"))
    records = [
        study_record(m, label, s, 80.0 + s, 6.0, prior_on_iter=on)
        for m, label, on in (("lorac", "LORAC", 64), ("mocom", "MoCo-M", None))
        for s in (0, 1)
    ]
    found = comparison(study, summarize(records, study.methods))
    assert "LORAC and MoCo-M trained the same objective" in found.text[0]
    assert not any("beats" in t or "within the seed spread" in t for t in found.text)
    assert found.table.rows[-1][0] == "mean [95 % CI]"  # the numbers are still shown
