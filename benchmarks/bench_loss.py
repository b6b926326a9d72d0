"""The LORAC loss with prior "laplace" vs prior "none" (forward + backward), in one process.

Target: the prior costs at most 5% at 7 queries, 64 instances, d = 128, K = 65536. The two
losses differ by less than the run-to-run noise, so the prior's own cost (``log_prior`` forward
+ backward alone) is printed as a share of the loss without it too. One key crop (view 0) and 7
queries; each criterion is called with its statistics, ||Q||_* included (as at a logging step).

Run: .venv/bin/python -m benchmarks.bench_loss
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F

from common import interleaved_timings
from pretrain.losses.lorac import LoracLoss


def main() -> None:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args()  # --help
    torch.manual_seed(0)
    views = F.normalize(torch.randn(8, 64, 128), dim=-1).requires_grad_()  # view 0: the key's
    keys = F.normalize(torch.randn(1, 64, 128), dim=-1)
    queues = F.normalize(torch.randn(1, 65536, 128), dim=-1)
    layout = dict(key_views=[0], lowrank_views=range(1, 8), tau=0.2, beta=4.0)
    criteria = {prior: LoracLoss(prior=prior, **layout) for prior in ("none", "laplace")}

    def run(prior: str):
        def step() -> None:
            criteria[prior](views, keys, queues)[0].backward()

        return step

    def prior_alone() -> None:
        lp, _ = criteria["laplace"].log_prior(views, keys)
        lp.sum().backward()

    fns = {"none": run("none"), "laplace": run("laplace"), "prior_alone": prior_alone}
    t = interleaved_timings(fns, repeats=15, inner=3)
    overhead = t["laplace"] / t["none"] - 1
    print(f"threads={torch.get_num_threads()} queries=7 N=64 d=128 K=65536 (Q: 8 rows)")
    print(
        f"none={t['none'] * 1e3:.1f}ms laplace={t['laplace'] * 1e3:.1f}ms "
        f"prior overhead={100 * overhead:+.1f}% (target <= +5%)"
    )
    share = t["prior_alone"] / t["none"]
    print(
        f"prior alone (log_prior fwd+bwd)={t['prior_alone'] * 1e3:.2f}ms "
        f"= {100 * share:.2f}% of none"
    )


if __name__ == "__main__":
    main()
