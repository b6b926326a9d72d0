"""Every benchmark with a main answers ``--help`` both as a user types it from the checkout's root,
``python benchmarks/X.py`` and ``python -m benchmarks.X``, with only what an install provides
importable (pretrain and transfer, not the checkout's root).

One driver process runs them all, as the interpreter does for each form (a process per run
would cost its ~3 s of imports, twice per benchmark): ``sys.path[0]`` is the script's folder for a
path and the current folder for ``-m``, and the benchmarks' modules and path entries of the run
before are dropped first, so that no run finds what another imported."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from tests.helpers import ROOT

DRIVER = """
import contextlib, io, json, runpy, sys

root, scripts = sys.argv[1], json.loads(sys.argv[2])
bench, base = root + "/benchmarks", sys.path[1:]
results = {}
for script in scripts:
    for form in ("path", "module"):
        for name, mod in list(sys.modules.items()):  # what the run before imported
            if (getattr(mod, "__file__", None) or "").startswith(bench + "/"):
                del sys.modules[name]
        sys.path[:] = [bench if form == "path" else root, *base]
        sys.argv = [f"{bench}/{script}.py", "--help"]
        out, code = io.StringIO(), "returned"
        try:
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
                if form == "path":
                    runpy.run_path(sys.argv[0], run_name="__main__")
                else:
                    runpy.run_module(f"benchmarks.{script}", run_name="__main__", alter_sys=True)
        except SystemExit as e:
            code = e.code
        except BaseException as e:
            code = f"{type(e).__name__}: {e}"
        results[f"{form} {script}"] = [code, out.getvalue()[:300]]
print(json.dumps(results))
"""


def test_every_benchmark_runs_as_a_path_and_as_a_module(tmp_path):
    scripts = sorted(
        p.stem
        for p in (ROOT / "benchmarks").glob("*.py")
        if 'if __name__ == "__main__":' in p.read_text()
    )
    assert len(scripts) >= 10  # the scan really found the benchmarks
    # what an install provides: the packages, not the checkout's root (the caller's path kept:
    # make test-oldest-torch puts the oldest torch there)
    for package in ("pretrain", "transfer"):
        (tmp_path / package).symlink_to(ROOT / package)
    kept = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    path = [str(tmp_path), *(p for p in kept if os.path.realpath(p) != str(ROOT.resolve()))]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join(path)}
    r = subprocess.run(
        [sys.executable, "-c", DRIVER, str(ROOT), json.dumps(scripts)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    results = json.loads(r.stdout.splitlines()[-1])
    failed = {run: r for run, r in results.items() if r[0] != 0 or "usage:" not in r[1]}
    assert failed == {}
    assert len(results) == 2 * len(scripts)
