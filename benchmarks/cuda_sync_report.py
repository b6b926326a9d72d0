"""CUDA's own word on host syncs: a short run with ``torch.cuda.set_sync_debug_mode``.

Prints and writes, per config, the syncs per checked iteration by source line
(:func:`pretrain.diagnostics.cuda_syncs.report`).

Run (on a GPU): python -m benchmarks.cuda_sync_report [--config C ...] [--json OUT]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from common import write_json
from pretrain.diagnostics.cuda_syncs import report

DEFAULT_CONFIGS = [
    "configs/pretrain/in100_r18_lorac_beta2.yaml",
    "configs/pretrain/in100_r18_mocom.yaml",
    "configs/pretrain/in100_r18_mocov2.yaml",
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", nargs="+", default=DEFAULT_CONFIGS)
    parser.add_argument("--opts", nargs="*", default=[], help="KEY VALUE config overrides")
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("error: cuda_sync_report needs a CUDA device")
    results = [report(c, args.opts) for c in args.config]
    for r in results:
        print(f"{Path(r['config']).stem}: {r['syncs_per_iteration']:g} syncs per iteration")
        for where, n in r["by_source"].items():
            print(f"    {n:g} x {where}")
    if args.json:
        write_json(results, args.json)


if __name__ == "__main__":
    main()
