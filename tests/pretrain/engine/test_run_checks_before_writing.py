"""A run built without the command line (the demo, the study, a notebook) checks its data and
its checkpoint before it writes anything into OUTPUT_DIR (its lock, config.yaml, env.txt)."""

from __future__ import annotations

import pytest
import torch

from pretrain.config.defaults import load_config
from pretrain.engine.run import run_pretraining
from pretrain.utils.errors import LoracError
from tests.helpers import make_image_folder, tiny_opts
from transfer.classification.demo import DEMO_CONFIG


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"SOLVER.IMS_PER_BATCH": 16, "MODEL.QUEUE_SIZE": 32}, "exceeds the dataset size"),
        ({"DATASETS.TYPE": "imagefiles", "DATASETS.ROOT": "{empty}"}, "no image files"),
        ({}, "is truncated"),
    ],
)
def test_a_mistake_leaves_output_dir_as_it_was(tmp_path, extra, message):
    data = make_image_folder(tmp_path / "data", classes=2, per_class=4, size=16)
    (tmp_path / "empty").mkdir()
    out = tmp_path / "run"
    extra = {k: str(v).replace("{empty}", str(tmp_path / "empty")) for k, v in extra.items()}
    cfg = load_config(DEMO_CONFIG, [*tiny_opts(data, out, **extra), "MODEL.DEVICE", "cpu"])
    if not extra:  # a run whose last checkpoint was cut off
        out.mkdir()
        (out / "config.yaml").write_text(cfg.dump())
        torch.save({"iteration": 2}, out / "model_0000002.pth")
        (out / "model_0000002.pth").write_bytes((out / "model_0000002.pth").read_bytes()[:64])
        (out / "last_checkpoint").write_text("model_0000002.pth")
    before = sorted(p.name for p in out.iterdir()) if out.exists() else None
    with pytest.raises(LoracError, match=message):
        run_pretraining(cfg)
    assert (sorted(p.name for p in out.iterdir()) if out.exists() else None) == before
