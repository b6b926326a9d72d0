"""What one non-logging pretraining iteration asks of the device: ops, host syncs, collectives.

Counted on the CPU as a GPU would run it (:func:`pretrain.diagnostics.step_count.measure`), or
on CUDA with ``--device cuda``.

Run: .venv/bin/python -m benchmarks.bench_step [--config C ...] [--procs 1 2] [--json OUT]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from common import IN1K_CONFIGS, write_json
from pretrain.diagnostics.step_count import measure


def _print(name: str, m: dict, verbose: bool) -> None:
    print(
        f"{name}: ops={m['ops']} host_syncs={m['host_syncs']} "
        f"collectives={sum(m['collectives'].values())} collective_bytes={m['collective_bytes']} "
        f"received={m['collective_bytes_received']}"
    )
    for where, n in sorted(m["syncs_by_source"].items()):
        print(f"    sync x{n}: {where}")
    received = m["collective_bytes_received_by_source"]
    for name, n in m["collectives"].items():
        print(f"    collective x{n}: {name} ({received.get(name, 0)} bytes received)")
    for where in m["layout_mismatches"]:
        print(f"    LAYOUT MISMATCH: {where}")
    for where, n in sorted(m["async_copies"].items()):
        print(f"    non-blocking host-to-device copy x{n}: {where}")
    if verbose:
        for name, n in m["ops_by_source"].items():
            print(f"    ops x{n}: from {name}")
        for name, n in m["top_ops"].items():
            print(f"    op x{n}: {name}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", nargs="+", default=IN1K_CONFIGS, help="config file(s)")
    parser.add_argument("--procs", nargs="+", type=int, default=[1, 2], help="process counts")
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--json", help="also write the figures to this file")
    parser.add_argument("--opts", nargs="*", default=[], help="KEY VALUE config overrides")
    parser.add_argument("--verbose", action="store_true", help="print the most frequent ops")
    args = parser.parse_args()
    torch.set_num_threads(1)
    report: dict[str, dict] = {}
    for config in args.config:
        for procs in args.procs:
            m = report[f"{config} x{procs}"] = measure(config, procs, args.device, args.opts)
            _print(f"{Path(config).stem} procs={procs}", m, args.verbose)
    if args.json:
        write_json(report, args.json)


if __name__ == "__main__":
    main()
