"""The CPU preset of the ImageNet-100 LORAC config: the same recipe on the CPU in float32, so
that one ``--config-file`` (instead of a handful of overrides of a GPU recipe) runs it on a
machine without a GPU: it loads, builds and trains an iteration there, and docs/pretraining.md
names it beside its own-photos command, whose config it inherits."""

from __future__ import annotations

import json
import re
import shlex

import yaml

from pretrain.cli import train_pretrain
from pretrain.config.defaults import load_config
from pretrain.modeling import build_model
from tests.helpers import ROOT, make_image_folder
from tests.helpers.mistakes import run_main

PRESET = ROOT / "configs" / "pretrain" / "cpu" / "in100_r18_lorac_beta2.yaml"
RECIPE = ROOT / "configs" / "pretrain" / "in100_r18_lorac_beta2.yaml"


def test_the_cpu_preset_is_the_gpu_recipe_on_the_cpu_in_float32():
    gpu, cpu = load_config(str(RECIPE)), load_config(str(PRESET))
    assert (gpu.MODEL.DEVICE, gpu.SOLVER.AMP.ENABLED) == ("cuda", True)  # shipped as it was
    assert (cpu.MODEL.DEVICE, cpu.SOLVER.AMP.ENABLED) == ("cpu", False)
    gpu.defrost()
    gpu.MODEL.DEVICE, gpu.SOLVER.AMP.ENABLED = "cpu", False
    assert cpu.dump() == gpu.dump()
    assert {p.device.type for p in build_model(cpu).parameters()} == {"cpu"}


def test_the_cpu_preset_trains_an_iteration_without_a_device_override(tmp_path):
    """Only the data and the sizes are overridden (tiny images, head and queue): not the
    device, not the precision."""
    photos = make_image_folder(tmp_path / "photos", classes=2, per_class=4, size=40)
    out = tmp_path / "run"
    opts = {
        "DATASETS.TYPE": "imagefiles", "DATASETS.ROOT": photos, "DATASETS.CLASS_LIST": "",
        "TEST.KNN_PERIOD": 0, "OUTPUT_DIR": out, "DATALOADER.NUM_WORKERS": 0,
        "MODEL.QUEUE_SIZE": 32, "MODEL.HEAD_HIDDEN_DIM": 64, "MODEL.HEAD_OUT_DIM": 16,
        "INPUT.LARGE_SIZE": 32, "INPUT.SMALL_SIZE": 16, "SOLVER.IMS_PER_BATCH": 8,
        "SOLVER.MAX_ITER": 1,
    }  # fmt: skip
    argv = ["--config-file", str(PRESET), *(str(x) for kv in opts.items() for x in kv)]
    r = run_main(train_pretrain.main, argv)
    assert r.returncode == 0, r.output
    assert (out / "model_final.pth").is_file()
    metrics = [json.loads(line) for line in (out / "metrics.json").read_text().splitlines()]
    assert [m["iteration"] for m in metrics if "total_loss" in m] == [0]


def test_the_pretraining_page_names_the_cpu_preset_of_its_photos_command():
    """Beside docs/pretraining.md's "Your own photos" command (a GPU config) stands the CPU
    preset of the config it names."""
    text = (ROOT / "docs" / "pretraining.md").read_text().replace("\\\n", " ")
    [line] = [ln for ln in re.findall(r"^python tools/train_pretrain\.py .*$", text, flags=re.M)
              if "DATASETS.TYPE imagefiles" in ln]  # fmt: skip
    argv = shlex.split(line)
    config = ROOT / argv[argv.index("--config-file") + 1]
    beside = text[text.index(line) + len(line) :].split("\n\n")[1]  # the paragraph after it
    [preset] = re.findall(r"`(configs/pretrain/cpu/[\w.-]+\.yaml)`", beside)
    base = yaml.safe_load((ROOT / preset).read_text())["_BASE_"]
    assert ((ROOT / preset).parent / base).resolve() == config.resolve()
