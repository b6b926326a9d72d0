"""docs/cluster.md gives the submitit folder each ``--entry`` really uses: ``OUTPUT_DIR/submitit``
for pretraining, ``output/submitit/<entry>`` (under the directory the job is submitted from) for
``train_net`` and the other tools."""

from __future__ import annotations

import os

from pretrain.cluster.submit import ENTRIES, JobRequest, build_job
from tests.helpers import ROOT
from transfer.classification.demo import DEMO_CONFIG

DOC = (ROOT / "docs" / "cluster.md").read_text()


def test_the_documented_job_dirs_are_the_real_ones(tmp_path):
    out = str(tmp_path / "run")
    pre = build_job(JobRequest(config_file=DEMO_CONFIG, args=["OUTPUT_DIR", out, "MODEL.DEVICE",
                                                              "cpu"], gpus_per_node=0))  # fmt: skip
    assert pre.folder == os.path.join(out, "submitit")
    assert "default `OUTPUT_DIR/submitit` for pretraining" in DOC
    for entry in ENTRIES:
        if entry == "pretrain":
            continue
        req = JobRequest(entry=entry, config_file="configs/x.yaml", args=["OUTPUT_DIR", out])
        assert build_job(req).folder == os.path.join("output", "submitit", entry)
    assert "`output/submitit/<entry>` under the current directory for the other `--entry`" in DOC
    assert "`output/submitit/train_net/<job id>/`" in DOC
