"""Detection on a CPU: the CPU preset of the Mask R-CNN config loads and builds and is the GPU
recipe at 2 images per iteration (detectron2's linear scaling); a CPU run shorter than
precise-BN's 200 iterations caps precise-BN at its length and says so in one log line before
precise-BN starts (it took 6.5 of the 7.5 minutes of a 2-iteration smoke run); the loader
workers are capped at the cores (torch warned about 4 workers on 2 cores in every loader); and a
``train_net`` run on 2 cores prints neither torch's CUDA_HOME notice nor a warning."""

from __future__ import annotations

import pytest
from detectron2.engine import DefaultTrainer
from detectron2.modeling import build_model

from tests.helpers import ROOT
from tests.helpers.mistakes import run_main
from tests.helpers.quiet import WORKER_WARNING, patch_two_cores, redo_cuda_home_notice
from tests.transfer.detection.test_detection_train import make_coco
from transfer.cli import train_net
from transfer.detection.config import fit_precise_bn_to_cpu, fit_workers_to_cores, load_config

CPU_PRESET = str(ROOT / "configs" / "cpu" / "coco_mask_rcnn_lorac.yaml")
GPU_RECIPE = str(ROOT / "configs" / "coco_mask_rcnn_lorac.yaml")
PRECISE_BN_NOTE = "TEST.PRECISE_BN.NUM_ITER 200 -> 2 on the CPU"


def test_the_cpu_preset_loads_and_builds_on_the_cpu():
    cfg = load_config(CPU_PRESET)
    assert cfg.MODEL.DEVICE == "cpu" and cfg.TEST.PRECISE_BN.ENABLED
    assert {p.device.type for p in build_model(cfg).parameters()} == {"cpu"}


def test_the_cpu_preset_is_the_gpu_recipe_scaled_to_two_images_per_iteration():
    """Everything as in the GPU config but the device and what detectron2's
    ``SOLVER.REFERENCE_WORLD_SIZE 8`` makes of the solver on one process: 1/8 of the batch and
    learning rate, 8x the iterations, steps, warm-up and checkpoint period."""
    gpu = load_config(GPU_RECIPE, ["SOLVER.REFERENCE_WORLD_SIZE", "8"])
    assert (gpu.MODEL.DEVICE, gpu.SOLVER.IMS_PER_BATCH) == ("cuda", 16)  # shipped as it was
    scaled = DefaultTrainer.auto_scale_workers(gpu, 1)
    scaled.defrost()
    scaled.MODEL.DEVICE, scaled.SOLVER.REFERENCE_WORLD_SIZE = "cpu", 0
    cpu = load_config(CPU_PRESET)
    assert cpu.SOLVER.IMS_PER_BATCH == 2
    assert cpu.dump() == scaled.dump()


def test_precise_bn_on_a_cpu_is_capped_at_the_run_length_with_a_note():
    cfg = load_config(CPU_PRESET, ["SOLVER.MAX_ITER", "2"])
    note = fit_precise_bn_to_cpu(cfg)
    assert note is not None and note.startswith(PRECISE_BN_NOTE)
    assert cfg.TEST.PRECISE_BN.ENABLED and cfg.TEST.PRECISE_BN.NUM_ITER == 2


@pytest.mark.parametrize("config", [GPU_RECIPE, CPU_PRESET], ids=["gpu", "cpu_full_schedule"])
def test_precise_bn_keeps_its_iterations_on_gpus_and_in_runs_as_long(config):
    cfg = load_config(config)
    assert fit_precise_bn_to_cpu(cfg) is None and cfg.TEST.PRECISE_BN.NUM_ITER == 200


@pytest.mark.parametrize(
    "given,procs,fit", [(4, 1, 1), (4, 2, 0), (-1, 1, 1), (0, 1, 0), (1, 1, 1)]
)
def test_loader_workers_are_capped_at_the_cores(monkeypatch, given, procs, fit):
    """On 2 cores: one worker for one process, none for two; -1 is that number, as in
    pretraining; fewer are kept."""
    patch_two_cores(monkeypatch)
    cfg = load_config(CPU_PRESET, ["DATALOADER.NUM_WORKERS", str(given)])
    note = fit_workers_to_cores(cfg, procs)
    workers = cfg.DATALOADER.NUM_WORKERS
    assert workers == fit
    assert (note is None) is (given == fit)


def test_a_short_cpu_run_notes_the_caps_first_and_prints_no_library_noise(tmp_path, monkeypatch):
    """The CPU preset as a 2-iteration smoke run (a ResNet-18 and tiny images to be quick), with
    precise-BN and the loader workers as configured, on 2 cores."""
    patch_two_cores(monkeypatch)
    redo_cuda_home_notice(monkeypatch, tmp_path)
    json_file, image_root = make_coco(tmp_path / "coco")
    argv = [
        "--config-file", CPU_PRESET, "--register-coco", "cpu_shapes", json_file, image_root,
        "MODEL.WEIGHTS", "", "MODEL.RESNETS.DEPTH", "18", "MODEL.ROI_HEADS.NUM_CLASSES", "2",
        "DATASETS.TRAIN", "('cpu_shapes',)", "DATASETS.TEST", "('cpu_shapes',)",
        "INPUT.MIN_SIZE_TRAIN", "(64,)", "INPUT.MAX_SIZE_TRAIN", "96",
        "INPUT.MIN_SIZE_TEST", "64", "INPUT.MAX_SIZE_TEST", "96",
        "SOLVER.MAX_ITER", "2", "SOLVER.STEPS", "(1,)", "SOLVER.WARMUP_ITERS", "1",
        "MODEL.RPN.BATCH_SIZE_PER_IMAGE", "32", "MODEL.ROI_HEADS.BATCH_SIZE_PER_IMAGE", "32",
        "MODEL.RPN.POST_NMS_TOPK_TRAIN", "100", "MODEL.RPN.POST_NMS_TOPK_TEST", "100",
        "TEST.DETECTIONS_PER_IMAGE", "10", "OUTPUT_DIR", str(tmp_path / "out"),
    ]  # fmt: skip
    r = run_main(train_net.main, argv)
    assert r.returncode == 0, r.output
    lines = r.output.splitlines()
    [note] = [i for i, line in enumerate(lines) if PRECISE_BN_NOTE in line]
    [start] = [i for i, line in enumerate(lines) if "Running precise-BN for 2 iterations" in line]
    assert note < start
    assert any("DATALOADER.NUM_WORKERS 4 -> 1" in line for line in lines)
    assert WORKER_WARNING not in r.output and "CUDA_HOME" not in r.output, r.output
    assert "Warning" not in r.output and "W1" not in r.output, r.output
