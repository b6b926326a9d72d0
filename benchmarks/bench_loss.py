"""lorac_loss with prior "laplace" vs prior "none" (forward + backward), in one process.

Issue target: the prior costs at most 5% at 7 queries, 64 instances, d = 128, K = 65536.
The two full losses differ by well under the machine's run-to-run noise (a few %, measured), so
the prior's own cost, ``log_prior`` forward + backward timed alone, is printed as a share of the
loss without it too.
Run: .venv/bin/python -m benchmarks.bench_loss
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from benchmarks.common import interleaved_timings
from pretrain.losses.lorac import log_prior, lorac_loss


def main() -> None:
    torch.manual_seed(0)
    queries = F.normalize(torch.randn(7, 64, 128), dim=-1).requires_grad_()
    key = F.normalize(torch.randn(64, 128), dim=-1)
    negatives = F.normalize(torch.randn(65536, 128), dim=-1)

    def run(prior: str):
        def step() -> None:
            lorac_loss(queries, key, negatives, tau=0.2, beta=4.0, prior=prior).backward()

        return step

    def prior_alone() -> None:
        lp, _ = log_prior(queries, key, tau=0.2, beta=4.0, prior="laplace")
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
