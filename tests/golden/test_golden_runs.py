"""Golden runs: fixed-seed tiny pretraining runs must reproduce their stored values, on any CPU.

What it proves: that the pretraining behaviour of the shipped recipes is unchanged. Each case
(tests/golden/cases.py: the shipped configs, bfloat16 as shipped and float32 twins) runs through
``PretrainTrainer`` for a few iterations on the CPU (one process, one thread, generated data);
every value of every metrics.json line and the final weights are compared with
``golden_metrics.json`` (tests/golden/compare.py):

* exactly, bit for bit, where this environment (torch, CPU, kernel-selecting variables) is one
  the file holds a record of: a refactoring, a reorganisation or a speed-up that claims "no
  change of behaviour" must pass untouched there;
* within the spread measured between CPUs everywhere else (another CPU's bfloat16 kernels give
  ~0.5 % different losses from the first iteration; float32's differ only in summation order),
  tight enough that three small planted changes fail on any CPU (``test_planted_change_is_caught``;
  ``make test-golden-isa`` runs this module under other instruction sets too).

When may the values be regenerated? Only for a deliberate change of behaviour (a fixed bug, a
new default, a changed recipe), stated as such in the commit message, or for a new torch (said so
too); never to make a refactoring pass. Commands
(``.venv/bin/python -m tests.golden.test_golden_runs``):

* ``--write [--case NAME ...]``: a change of behaviour: run the cases here, make this
  environment's record the reference, drop those cases from other environments' records (they
  hold the old behaviour) and measure their spread again (runs under ``EMULATED_CPUS``, ~10 min);
* ``--add-environment``: record this CPU's exact values beside the reference (no change of
  behaviour: refused unless they are within the tolerances); the spread grows to include them;
* ``--measure-spread``: measure every case's spread again (on the reference's machine);
* ``--check``: compare as the tests do, without pytest.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests.golden.cases import CASES, PLANTS, TIMING_KEYS, environment, run_case
from tests.golden.compare import (
    EMULATED_CPUS,
    EXACT_KEYS,
    FACTOR,
    FLOOR,
    NOISY_KEYS,
    exact_differences,
    measure_spread,
    tolerance_from_spread,
    tolerant_differences,
)

GOLDEN_FILE = Path(__file__).with_name("golden_metrics.json")
# The case the planted changes are tried on: LORAC with its prior, float32 (the tight guard).
PLANT_CASE = "lorac_demo_fp32"


def load_golden() -> dict:
    return json.loads(GOLDEN_FILE.read_text())


def matches(recorded: dict, env: dict) -> bool:
    """Whether ``env`` is the environment of a record: every field the record holds is equal."""
    return all(env.get(k) == v for k, v in recorded.items())


def expectation(golden: dict, name: str, env: dict) -> tuple[str, dict, list[str]]:
    """("exact", record, []) where a record of this environment holds case ``name``; else
    ("tolerant", the reference's record, []). The list: why not exact, for the message."""
    for record in golden["records"]:
        if name in record["cases"] and matches(record["environment"], env):
            return "exact", record["cases"][name], []
    return (
        "tolerant",
        golden["records"][0]["cases"][name],
        [
            f"no record of this environment ({env}) holds {name}: compared within the spread "
            f"measured between CPUs, against the reference recorded on "
            f"{golden['records'][0]['environment']}"
        ],
    )


def compare(golden: dict, name: str, got: dict, env: dict) -> tuple[str, list[str]]:
    """(mode, differences) of a new record of case ``name`` against the golden file."""
    mode, stored, _ = expectation(golden, name, env)
    if mode == "exact":
        return mode, exact_differences(stored, got)
    return mode, tolerant_differences(stored, got, golden["tolerance"][name])


# -- tests ------------------------------------------------------------------------------------
def test_every_case_is_stored():
    """The reference holds exactly the cases defined here, each with its spread and tolerance
    (none dropped or left unrecorded)."""
    golden = load_golden()
    assert sorted(golden["records"][0]["cases"]) == sorted(CASES)
    assert sorted(golden["spread"]) == sorted(CASES) == sorted(golden["tolerance"])
    for record in golden["records"][1:]:
        assert set(record["cases"]) <= set(CASES), record["environment"]


def test_tolerances_follow_the_recorded_spread():
    """Every tolerance is FACTOR x its measured spread (at least the floor): none widened by hand;
    and every float metric the reference logs has one."""
    golden = load_golden()
    assert golden["factor"] == FACTOR and golden["floor"] == FLOOR
    for name, spread in golden["spread"].items():
        assert golden["tolerance"][name] == tolerance_from_spread(spread), name
        lines = golden["records"][0]["cases"][name]["metrics"]
        logged = {k for line in lines for k, v in line.items() if isinstance(v, float)}
        assert logged - EXACT_KEYS - NOISY_KEYS == set(spread["metrics"]), name
        assert set(spread["model"]) == set(golden["records"][0]["cases"][name]["model"]["sample"])


def test_the_warmup_case_records_both_sides_of_the_switch():
    """The warm-up case covers what it claims: beta = inf, then the shipped beta = 2."""
    for name in ("lorac_demo_beta_warmup", "lorac_demo_beta_warmup_fp32"):
        lines = load_golden()["records"][0]["cases"][name]["metrics"]
        betas = [m["beta"] for m in lines if "beta" in m]
        assert betas == [math.inf] * 3 + [2.0] * 3, (name, betas)


@pytest.mark.parametrize("name", sorted(CASES))
def test_golden_run_is_reproduced(name, tmp_path):
    """Case ``name`` logs the stored values and ends on the stored weights: bit for bit in a
    recorded environment, within the measured spread elsewhere."""
    golden, env = load_golden(), environment()
    mode, diffs = compare(golden, name, run_case(name, tmp_path), env)
    why = expectation(golden, name, env)[2]
    assert not diffs, f"{name}: behaviour changed ({mode} comparison{'; ' if why else ''}" + (
        "; ".join(why) + "):\n  " + "\n  ".join(diffs)
    )


@pytest.mark.parametrize("plant", sorted(PLANTS))
def test_planted_change_is_caught(plant, tmp_path):
    """A small change of behaviour fails the comparison within the spread, the weaker of the two
    (exact fails on any change): on this CPU, and on every CPU ``make test-golden-isa`` emulates."""
    golden = load_golden()
    got = run_case(PLANT_CASE, tmp_path, plant=plant)
    stored = golden["records"][0]["cases"][PLANT_CASE]
    assert tolerant_differences(stored, got, golden["tolerance"][PLANT_CASE]), plant


# -- regeneration -----------------------------------------------------------------------------
def _run(names: list[str]) -> dict[str, dict]:
    out = {}
    for name in names:
        with tempfile.TemporaryDirectory() as tmp:
            got = out[name] = run_case(name, Path(tmp))
        print(f"{name}: {len(got['metrics'])} lines, model {got['model']['sha256'][:16]}")
    return out


def _emulated_runs(names: list[str]) -> list[dict[str, dict]]:
    """The cases run in a fresh process under each of EMULATED_CPUS (the variables are read
    when the kernels load: they cannot change inside this process)."""
    runs = []
    for variables in EMULATED_CPUS:
        with tempfile.NamedTemporaryFile(suffix=".json") as f:
            env = {**os.environ, **variables, "OMP_NUM_THREADS": "1"}
            cmd = [sys.executable, "-m", "tests.golden.test_golden_runs", "--dump", f.name]
            print(f"running {len(names)} cases with {variables}", flush=True)
            subprocess.run([*cmd, "--case", *names], env=env, check=True, stdout=subprocess.DEVNULL)
            runs.append(json.loads(Path(f.name).read_text()))
    return runs


def _measure(golden: dict, names: list[str]) -> None:
    """The spread of ``names``: emulated CPUs here, and the records of other environments."""
    emulated = _emulated_runs(names)
    for name in names:
        others = [run[name] for run in emulated]
        others += [r["cases"][name] for r in golden["records"][1:] if name in r["cases"]]
        golden["spread"][name] = measure_spread(golden["records"][0]["cases"][name], others)


def _finish(golden: dict) -> None:
    golden["factor"], golden["floor"] = FACTOR, FLOOR
    golden["tolerance"] = {n: tolerance_from_spread(s) for n, s in sorted(golden["spread"].items())}
    golden["records"] = [golden["records"][0]] + [r for r in golden["records"][1:] if r["cases"]]
    text = json.dumps(golden, indent=1, allow_nan=True)
    # a list of numbers on one line (the weight samples: 256 lines each otherwise)
    text = re.sub(r"\[([^\[\]{}\"]*)\]", lambda m: "[" + " ".join(m.group(1).split()) + "]", text)
    GOLDEN_FILE.write_text(text + "\n")


def _write(names: list[str]) -> None:
    golden = load_golden() if GOLDEN_FILE.exists() else {"records": [], "spread": {}}
    env = environment()
    reference = next((r for r in golden["records"] if r["environment"] == env), None)
    reference = reference or {"environment": env, "cases": {}}
    golden["records"] = [reference] + [r for r in golden["records"] if r is not reference]
    reference["cases"].update(_run(names))
    missing = sorted(set(CASES) - set(reference["cases"]))
    if missing:
        sys.exit(f"error: this environment becomes the reference but lacks {missing}: --write all")
    for other in golden["records"][1:]:
        for name in names:
            if other["cases"].pop(name, None) is not None:
                print(f"dropped {name} of {other['environment']['cpu']} (the old behaviour)")
    golden.update(
        about="tests/golden/test_golden_runs.py: regenerate only for a deliberate change of "
        "behaviour, said in the commit (see that module's docstring)",
        timing_keys_left_out=sorted(TIMING_KEYS),
    )
    _measure(golden, names)
    _finish(golden)


def _add_environment() -> int:
    golden, env = load_golden(), environment()
    if matches(golden["records"][0]["environment"], env):
        sys.exit("error: this is the reference's environment: nothing to add")
    got = _run(sorted(CASES))
    failed = False
    for name, record in got.items():
        diffs = tolerant_differences(
            golden["records"][0]["cases"][name], record, golden["tolerance"][name]
        )
        if diffs:
            failed = True
            print(f"{name}: outside the tolerances:\n  " + "\n  ".join(diffs))
    if failed:
        return 1
    golden["records"] = [r for r in golden["records"] if r["environment"] != env]
    golden["records"].append({"environment": env, "cases": got})
    for name, record in got.items():
        ref = golden["records"][0]["cases"][name]
        grown = measure_spread(ref, [record])
        old = golden["spread"][name]
        for k, values in grown["metrics"].items():
            old["metrics"][k] = [max(a, b) for a, b in zip(old["metrics"][k], values, strict=True)]
        for module, d in grown["model"].items():
            old["model"][module] = max(old["model"][module], d)
    _finish(golden)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Regenerate or check tests/golden's values.")
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--write", action="store_true", help="a change of behaviour: record anew")
    mode.add_argument("--add-environment", action="store_true", help="record this CPU exactly")
    mode.add_argument("--measure-spread", action="store_true", help="measure the spread again")
    mode.add_argument("--check", action="store_true", help="compare with the stored values")
    mode.add_argument("--dump", metavar="FILE", help=argparse.SUPPRESS)  # _emulated_runs
    parser.add_argument("--case", nargs="+", choices=sorted(CASES), help="only these cases")
    args = parser.parse_args(argv)
    names = args.case or sorted(CASES)
    if args.dump:
        Path(args.dump).write_text(json.dumps(_run(names), allow_nan=True))
    elif args.write:
        _write(names)
    elif args.add_environment:
        return _add_environment()
    elif args.measure_spread:
        golden = load_golden()
        _measure(golden, names)
        _finish(golden)
    else:
        golden, env, failed = load_golden(), environment(), False
        for name in names:
            with tempfile.TemporaryDirectory() as tmp:
                mode_, diffs = compare(golden, name, run_case(name, Path(tmp)), env)
            failed |= bool(diffs)
            print(f"{name} ({mode_}): " + ("ok" if not diffs else "\n  ".join(["DIFFERS", *diffs])))
        return int(failed)
    return 0


if __name__ == "__main__":
    sys.exit(main())
