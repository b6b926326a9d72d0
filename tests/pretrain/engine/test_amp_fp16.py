"""float16 autocast with a GradScaler, on the CPU (``torch.amp.GradScaler("cpu")``): the option
the GPU configs keep beside their bfloat16 default trains, checkpoints the scaler, and a resumed
run equals an uninterrupted one bit for bit."""

from __future__ import annotations

import pytest
import torch
from detectron2.engine import HookBase

from pretrain.config import load_config
from pretrain.engine.trainer import PretrainTrainer
from tests.helpers import ROOT, tiny_opts

DEMO_CONFIG = str(ROOT / "configs" / "pretrain" / "demo_fashion_mnist_r18.yaml")
# float16 convolutions on the CPU cost in proportion to the batch: two images, four iterations,
# a checkpoint after the second (the one the crashed run resumes from)
FP16 = {
    "SOLVER.AMP.ENABLED": True,
    "SOLVER.AMP.PRECISION": "float16",
    "SOLVER.IMS_PER_BATCH": 2,
    "SOLVER.MAX_ITER": 4,
    "SOLVER.CHECKPOINT_PERIOD": 2,
}


class _Crash(HookBase):
    def before_step(self):
        if self.trainer.iter == 2:
            raise RuntimeError("simulated preemption")


def _train(opts, hooks=()):
    trainer = PretrainTrainer(load_config(DEMO_CONFIG, opts))
    trainer.register_hooks(list(hooks))
    trainer.resume()
    trainer.train()
    return trainer


def test_float16_with_grad_scaler_trains_and_resumes_exactly(tmp_path, image_folder):
    full = _train(tiny_opts(image_folder, tmp_path / "a", **FP16))
    assert isinstance(full.grad_scaler, torch.amp.GradScaler)
    ckpt = torch.load(tmp_path / "a" / "model_final.pth", weights_only=True)
    assert "scale" in ckpt["trainer"]["grad_scaler"]
    with pytest.raises(RuntimeError, match="simulated preemption"):
        _train(tiny_opts(image_folder, tmp_path / "b", **FP16), [_Crash()])
    resumed = _train(tiny_opts(image_folder, tmp_path / "b", **FP16))
    assert resumed.start_iter == 2
    a = full.model.state_dict()
    b = resumed.model.state_dict()
    for k in a:
        assert torch.equal(a[k], b[k]), k
    assert full.grad_scaler.state_dict() == resumed.grad_scaler.state_dict()
