"""The pretraining engine end to end on CPU: loss goes down, exact resume, bad input handling."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest
import torch
from detectron2.engine import HookBase
from PIL import Image

from pretrain.config.defaults import ConfigError, load_config
from pretrain.data.datasets import DatasetError
from pretrain.engine.trainer import PretrainTrainer
from tests.helpers import make_image_folder, tiny_opts
from transfer.classification.demo import DEMO_CONFIG


def _train(opts: list[str], hooks: list | None = None) -> PretrainTrainer:
    cfg = load_config(DEMO_CONFIG, opts)
    trainer = PretrainTrainer(cfg)
    if hooks:
        trainer.register_hooks(hooks)
    trainer.resume()
    trainer.train()
    return trainer


def _metrics(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.json").read_text().splitlines()]


def _params(trainer: PretrainTrainer) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in trainer.model.state_dict().items()}


# The demo's full-image crops (scale (1, 1), tuned for Fashion-MNIST at 1.25 epochs) leave the
# loss of this tiny generated set flat over 20-40 iterations (measured 4.58 -> 4.63); with
# (0.3, 1) crops it falls. The demo's own learning is measured by its kNN (docs/demo.md).
EXTRA = {"INPUT.LARGE_SCALE": "(0.3, 1.0)"}


def test_demo_config_20_iterations_lowers_the_loss(tmp_path):
    """A 20-iteration CPU run of the demo config (on generated data) lowers the loss."""
    # 240 images > queue + batch, so no instance is ever its own negative; the queue holds one
    # batch, so from iteration 2 on the negatives are real keys and losses are comparable.
    root = make_image_folder(tmp_path / "data", classes=4, per_class=60)
    out = tmp_path / "run"
    opts = {
        "SOLVER.MAX_ITER": 20,
        "SOLVER.CHECKPOINT_PERIOD": 100,
        "MODEL.QUEUE_SIZE": 16,
        "SOLVER.IMS_PER_BATCH": 16,
        **EXTRA,
    }
    _train(tiny_opts(root, out, **opts))
    losses = [m["total_loss"] for m in _metrics(out) if "total_loss" in m]
    assert len(losses) == 20
    first, last = sum(losses[2:7]) / 5, sum(losses[-5:]) / 5
    assert last < first - 0.02, (first, last)
    logged = _metrics(out)[-1]
    for key in ("nuclear_norm", "inst_acc", "lr", "beta", "images_per_sec", "data_time"):
        assert key in logged, key
    assert (out / "config.yaml").exists()
    assert (out / "model_final.pth").exists()


class _Crash(HookBase):
    def __init__(self, at: int):
        self.at = at

    def before_step(self):
        if self.trainer.iter == self.at:
            raise RuntimeError("simulated preemption")


@pytest.mark.parametrize(
    ("prior", "static"), [("laplace", False), ("batchwise", False), ("laplace", True)]
)
def test_stop_and_resume_equals_uninterrupted(tmp_path, image_folder, prior, static):
    """Bit for bit, the static step too (its device lr, ring buffer and queue pointers)."""
    opts = {"LOSS.PRIOR": prior, "SOLVER.STATIC_STEP": static}
    full = _train(tiny_opts(image_folder, tmp_path / "a", **opts))
    with pytest.raises(RuntimeError, match="simulated preemption"):
        _train(tiny_opts(image_folder, tmp_path / "b", **opts), [_Crash(4)])
    assert (tmp_path / "b" / "last_checkpoint").read_text() == "model_0000002.pth"
    resumed = _train(tiny_opts(image_folder, tmp_path / "b", **opts))
    assert resumed.start_iter == 3
    a, b = _params(full), _params(resumed)
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k
    # the optimiser state (LARS momentum) matched too
    sa, sb = full.optimizer.state_dict()["state"], resumed.optimizer.state_dict()["state"]
    for i in sa:
        assert torch.equal(sa[i]["momentum_buffer"], sb[i]["momentum_buffer"])


def test_checkpoint_is_weights_only_and_holds_everything(tmp_path, image_folder):
    _train(tiny_opts(image_folder, tmp_path / "r"))
    ckpt = torch.load(tmp_path / "r" / "model_final.pth", weights_only=True)
    assert {"model", "trainer"} <= set(ckpt)
    model = ckpt["model"]
    assert any(k.startswith("encoder_q.backbone.") for k in model)
    assert any(k.startswith("encoder_k.") for k in model)
    assert "queues" in model and "queue_ptr" in model
    assert {"iteration", "optimizer", "hooks", "rng"} <= set(ckpt["trainer"])
    # the backbone loads into a torchvision ResNet
    from transfer.checkpoint.reader import build_torchvision_backbone, load_backbone

    net = build_torchvision_backbone(load_backbone(str(tmp_path / "r" / "model_final.pth")))
    assert net.eval()(torch.randn(1, 3, 32, 32)).shape == (1, 512)


def test_bad_images_are_skipped_once_and_counted(tmp_path, caplog):
    root = make_image_folder(tmp_path / "data", classes=2, per_class=10)
    bad = root / "class0"
    (bad / "zero.jpg").write_bytes(b"")
    (bad / "notes.txt").write_text("not an image")
    good = (root / "class1" / "img1.jpg").read_bytes()
    (bad / "truncated.jpg").write_bytes(good[: len(good) // 2])
    (bad / "corrupt.png").write_bytes(b"\x89PNG\r\n\x1a\n" + os.urandom(200))
    arr = (torch.rand(24, 24) * 65535).to(torch.int32).numpy().astype("uint16")
    Image.fromarray(arr).save(bad / "deep16.png")
    Image.new("CMYK", (30, 30), (10, 20, 30, 0)).save(bad / "cmyk.jpg")
    Image.new("P", (30, 30)).save(bad / "palette.png")
    Image.new("RGBA", (30, 30), (200, 10, 10, 100)).save(bad / "alpha.png")
    Image.new("L", (30, 30), 128).save(bad / "grey.png")
    out = tmp_path / "run"
    with caplog.at_level("WARNING"):
        _train(tiny_opts(root, out, **{"SOLVER.MAX_ITER": 8, "SOLVER.IMS_PER_BATCH": 8}))
    warned = [
        r.getMessage() for r in caplog.records if "skipped unreadable image" in r.getMessage()
    ]
    names = sorted({Path(w.split(": ", 1)[1].split(":")[0]).name for w in warned})
    assert names == ["corrupt.png", "notes.txt", "truncated.jpg", "zero.jpg"]
    assert len(warned) == len(names)  # one warning each
    assert _metrics(out)[-1]["data/skipped_files"] == 4.0


def test_image_modes_become_rgb(tmp_path):
    from pretrain.data.datasets import load_image

    arr = (torch.arange(64 * 64) % 65536).reshape(64, 64).numpy().astype("uint16") * 16
    src = Image.fromarray(arr)
    assert src.mode.startswith("I;16")
    src.save(tmp_path / "a.png")
    img = load_image(str(tmp_path / "a.png"))
    assert img.mode == "RGB" and 0 < max(img.getextrema()[0]) <= 255
    assert img.getextrema()[0][1] > 200  # scaled, not clipped to white
    for mode, color in [("CMYK", (0, 0, 0, 0)), ("P", 3), ("RGBA", (1, 2, 3, 4)), ("L", 9)]:
        Image.new(mode, (8, 8), color).save(tmp_path / f"x.{'jpg' if mode == 'CMYK' else 'png'}")
        ext = "jpg" if mode == "CMYK" else "png"
        assert load_image(str(tmp_path / f"x.{ext}")).mode == "RGB"


@pytest.mark.parametrize(
    "override,match",
    [
        (["LOSS.TAU", "0.0"], "LOSS.TAU"),
        (["LOSS.TAU", "-0.1"], "LOSS.TAU"),
        (["LOSS.BETA", "0.0"], "LOSS.BETA"),
        (["LOSS.BETA", "-1.0"], "LOSS.BETA"),
        (["MODEL.QUEUE_SIZE", "100"], "MODEL.QUEUE_SIZE"),
        (["INPUT.LARGE_CROPS", "1", "INPUT.SMALL_CROPS", "0", "INPUT.KEY_CROPS", "1"], "two views"),
        (["LOSS.PRIOR", "cauchy"], "LOSS.PRIOR"),
        (["SOLVER.NOT_A_KEY", "1"], "SOLVER.NOT_A_KEY"),
    ],
)
def test_invalid_config_values_are_named(tmp_path, image_folder, override, match):
    with pytest.raises(ConfigError, match=match):
        load_config(DEMO_CONFIG, tiny_opts(image_folder, tmp_path / "o") + override)


def test_unknown_key_in_yaml_names_file_and_key(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(f'_BASE_: "{DEMO_CONFIG}"\nLOSS:\n  TAUU: 0.1\n')
    with pytest.raises(ConfigError, match=r"bad\.yaml.*LOSS\.TAUU"):
        load_config(str(bad))


@pytest.mark.parametrize("kind", ["missing", "empty"])
def test_missing_or_empty_root_stops_before_training(tmp_path, kind):
    root = tmp_path / "nothing"
    if kind == "empty":
        root.mkdir()
    cfg = load_config(DEMO_CONFIG, tiny_opts(root, tmp_path / "o"))
    with pytest.raises(DatasetError, match=str(root)):
        PretrainTrainer(cfg)


def test_non_finite_loss_stops_and_keeps_last_checkpoint(tmp_path, image_folder):
    out = tmp_path / "run"
    opts = tiny_opts(image_folder, out, **{"SOLVER.MAX_ITER": 9})  # checkpoints at 2, 5, 8

    class _Crash(HookBase):  # a run that died after the checkpoint of iteration 5
        def before_step(self):
            if self.trainer.iter == 6:
                raise RuntimeError("killed")

    with pytest.raises(RuntimeError, match="killed"):
        _train(opts, [_Crash()])
    before = (out / "model_0000005.pth").read_bytes()

    class _Poison(HookBase):
        def before_step(self):
            with torch.no_grad():
                next(self.trainer.model.encoder_q.parameters()).fill_(float("nan"))

    with pytest.raises(FloatingPointError, match="non-finite loss"):
        _train(opts, [_Poison()])  # resumes at 6, the same config
    assert (out / "model_0000005.pth").read_bytes() == before
    assert (out / "last_checkpoint").read_text() == "model_0000005.pth"
    assert not (out / "model_final.pth").exists()
    ckpt = torch.load(out / "model_0000005.pth", weights_only=True)
    assert all(torch.isfinite(v).all() for v in ckpt["model"].values() if v.is_floating_point())


def test_resume_removes_temporaries_of_an_interrupted_write(tmp_path, image_folder):
    out = tmp_path / "r"
    _train(tiny_opts(image_folder, out))
    junk = out / ".tmp-model_0000005.pth-abc123"
    junk.write_bytes(b"half a checkpoint")
    cfg = load_config(DEMO_CONFIG, tiny_opts(image_folder, out))
    trainer = PretrainTrainer(cfg)
    assert trainer.resume()
    assert not junk.exists()


def test_demo_runs_on_an_image_folder(tmp_path):
    """The demo tool's library path on an ImageFolder root: trains, evaluates kNN for both nets."""
    from transfer.classification.demo import run_demo

    root = make_image_folder(tmp_path / "data", classes=3, per_class=12)
    res = run_demo(
        str(tmp_path / "demo"),
        tiny_opts(root, tmp_path / "demo", **{"SOLVER.MAX_ITER": 2}),
        n_train=100,
        n_test=100,
    )
    assert Path(res.checkpoint).exists()
    assert 0.0 <= res.knn_pretrained <= 1.0 and 0.0 <= res.knn_random <= 1.0
    assert 0.0 <= res.knn_raw_pixels <= 1.0 and res.method == "LORAC"
    assert res.header.startswith("kNN top-1 on 8 held-out images of ")
    # the kNN table stays with the run: results.json and log.txt
    saved = json.loads((tmp_path / "demo" / "results.json").read_text())
    assert saved["results"]["knn_top1"] == {
        "raw pixels": res.knn_raw_pixels,
        "random init": res.knn_random,
        "LORAC": res.knn_pretrained,
    }
    assert saved["results"]["header"] == res.header and saved["config"]["SOLVER"]["MAX_ITER"] == 2
    log = (tmp_path / "demo" / "log.txt").read_text()
    assert res.header in log and f"LORAC          {100 * res.knn_pretrained:.2f} %" in log


def test_bf16_autocast_and_channels_last_train(tmp_path, image_folder):
    """SOLVER.AMP (bf16 autocast on CPU) and MODEL.CHANNELS_LAST run and give finite losses."""
    out = tmp_path / "amp"
    opts = {"SOLVER.AMP.ENABLED": True, "MODEL.CHANNELS_LAST": True, "SOLVER.MAX_ITER": 3}
    trainer = _train(tiny_opts(image_folder, out, **opts))
    losses = [m["total_loss"] for m in _metrics(out) if "total_loss" in m]
    assert len(losses) == 3 and all(math.isfinite(x) for x in losses)
    assert trainer.amp_dtype == torch.bfloat16


def test_skipped_files_and_warnings_continue_across_resume(tmp_path, caplog):
    """The warned set and data/skipped_files are in the checkpoint: a resumed run neither warns
    again about a file warned before the checkpoint nor restarts the count at 0."""
    root = make_image_folder(tmp_path / "data", classes=2, per_class=10)
    (root / "class0" / "zero.jpg").write_bytes(b"")
    (root / "class0" / "notes.txt").write_text("not an image")
    (root / "class1" / "bad.png").write_bytes(b"\x89PNG\r\n\x1a\n" + os.urandom(200))
    out = tmp_path / "run"
    opts = tiny_opts(root, out, **{"SOLVER.MAX_ITER": 8, "SOLVER.CHECKPOINT_PERIOD": 3})

    def warned() -> list[str]:
        msgs = [r.getMessage() for r in caplog.records]
        caplog.clear()
        return [m.split(": ", 1)[1] for m in msgs if "skipped unreadable image" in m]

    with caplog.at_level("WARNING"), pytest.raises(RuntimeError, match="simulated"):
        _train(opts, [_Crash(3)])  # iterations 0-2 done and checkpointed
    before = warned()
    ckpt = torch.load(out / "model_0000002.pth", weights_only=True)
    assert sorted(ckpt["trainer"]["skipped_files"]) == sorted(before)
    assert before  # 3 x 8 samples, 23 files: the first epoch met some bad files
    counts = {
        m["iteration"]: m["data/skipped_files"] for m in _metrics(out) if "data/skipped_files" in m
    }
    count_at_2 = counts[2]
    assert count_at_2 == len(before)
    with caplog.at_level("WARNING"):
        _train(opts)  # the next epochs meet every bad file again
    after = warned()
    assert not set(before) & set(after), "warned again after the resume"
    assert len(before) + len(after) == 3
    counts = {
        m["iteration"]: m["data/skipped_files"] for m in _metrics(out) if "data/skipped_files" in m
    }
    assert counts[3] >= count_at_2  # continued, not restarted
    assert counts[7] == 3.0


@pytest.mark.parametrize("umask", [0o022, 0o027])
def test_files_written_get_the_mode_open_gives_under_the_umask(tmp_path, image_folder, umask):
    """Checkpoints (written through a temporary file), last_checkpoint, metrics and the config
    dump all get 0o666 & ~umask, as open() gives: 0o644 under 022, not mkstemp's 0o600."""
    out = tmp_path / "r"
    old = os.umask(umask)
    try:
        _train(tiny_opts(image_folder, out))
    finally:
        os.umask(old)
    files = [p for p in out.iterdir() if p.is_file()]
    names = {p.name for p in files}
    assert {"model_0000002.pth", "model_final.pth", "last_checkpoint", "metrics.json"} <= names
    modes = {p.name: oct(p.stat().st_mode & 0o777) for p in files}
    assert set(modes.values()) == {oct(0o666 & ~umask)}, modes
