"""tools/analyze_nuclear_norm.py and transfer.analysis: ||Q_hat||_* of augmented test views.

Tiny randomly initialised ResNet-18 runs (16 px) written to disk as the trainer leaves them.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch

from pretrain.data.datasets import ImageFolderSource
from pretrain.data.splits import evenly_spaced
from pretrain.modeling import MultiViewMoCo, build_model
from tests.helpers import make_image_folder
from tests.helpers.analysis import (
    assert_png_not_blank,
    exit_status,
    make_fashion_mnist,
    make_run,
    make_symmetric_folder,
    tiny_cfg,
)
from transfer.analysis import AnalysisError
from transfer.analysis.models import load_pretrained
from transfer.analysis.nuclear_norm_outputs import AnalysisOptions, analyze, write_outputs
from transfer.analysis.nuclear_norm_stats import augmented_nuclear_norms, view_spec
from transfer.cli.analyze_nuclear_norm import main as analyze_main
from transfer.tables import read_csv

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def one_thread():
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


@pytest.fixture(scope="module")
def sweep(tmp_path_factory) -> dict[str, Path]:
    """Image folder with train/ and val/, and three runs: beta 2, beta 8, prior none."""
    tmp = tmp_path_factory.mktemp("sweep")
    data = tmp / "data"
    make_image_folder(data / "train", classes=2, per_class=4, size=24)
    make_image_folder(data / "val", classes=2, per_class=3, size=24)
    runs = {
        "b2": make_run(tmp / "b2", data, seed=1, **{"LOSS.BETA": 2.0}),
        "b8": make_run(tmp / "b8", data, seed=2, **{"LOSS.BETA": 8.0}),
        "mocom": make_run(tmp / "mocom", data, seed=3, **{"LOSS.PRIOR": "none"}),
    }
    return {"data": data, "tmp": tmp, **runs}


def test_identical_views_give_sqrt_of_view_count(tmp_path):
    """Full-image crops, no colour change and mirror-symmetric images (flips change nothing):
    all 32 views are identical, so Q_hat has rank 1 and ||Q_hat||_* = sqrt(32) exactly. With the
    run's real augmentation the same images give clearly more."""
    root = make_symmetric_folder(tmp_path / "sym", size=16)
    source = ImageFolderSource(str(root))
    same = tiny_cfg(
        root,
        tmp_path,
        **{
            "INPUT.LARGE_SCALE": "(1.0, 1.0)",
            "INPUT.JITTER_PROB": 0.0,
            "INPUT.GRAYSCALE_PROB": 0.0,
            "INPUT.BLUR_PROB": 0.0,
        },
    )
    model = build_model(same)
    crop, color = view_spec(same, 32)
    values = augmented_nuclear_norms(model.encoder_q, source, range(4), crop, color, batch_images=3)
    np.testing.assert_allclose(values, math.sqrt(32), rtol=0, atol=1e-4)

    real = tiny_cfg(root, tmp_path)
    crop, color = view_spec(real, 32)
    augmented = augmented_nuclear_norms(model.encoder_q, source, range(4), crop, color)
    assert (augmented > math.sqrt(32) + 0.05).all(), augmented


def test_values_are_per_image_deterministic_and_bounded(sweep):
    """Per-image seeds: the batch size and the subset do not change an image's value; and
    sqrt(V) <= ||Q_hat||_* <= sqrt(V * min(V, d)) for unit rows."""
    model = load_pretrained(str(sweep["b2"]))
    source = ImageFolderSource(str(sweep["data"] / "val"))
    crop, color = view_spec(model.cfg, 32)
    enc = model.model.encoder_q
    all4 = augmented_nuclear_norms(enc, source, range(4), crop, color, batch_images=4)
    one_by_one = augmented_nuclear_norms(enc, source, range(4), crop, color, batch_images=1)
    subset = augmented_nuclear_norms(enc, source, [2, 3], crop, color, batch_images=2)
    np.testing.assert_allclose(all4, one_by_one, rtol=1e-5)
    np.testing.assert_allclose(all4[2:], subset, rtol=1e-5)
    other_seed = augmented_nuclear_norms(enc, source, range(4), crop, color, seed=1)
    assert not np.allclose(all4, other_seed)
    d = model.cfg.MODEL.HEAD_OUT_DIM
    assert (all4 >= math.sqrt(32) - 1e-4).all() and (all4 <= math.sqrt(32 * min(32, d))).all()


def test_sweep_writes_every_figure_with_matching_csv(sweep, tmp_path, monkeypatch):
    """Three runs with kNN accuracy: histogram, nuclear norm vs beta and accuracy vs nuclear
    norm are drawn, non-blank, and each plots exactly the data rows of its CSV. The kNN embeds
    through the model's own ``backbone_features`` (its contract with evaluation tools)."""
    calls = []
    features = MultiViewMoCo.backbone_features

    def spy(self, images):
        calls.append(images.shape[0])
        return features(self, images)

    monkeypatch.setattr(MultiViewMoCo, "backbone_features", spy)
    paths = [str(sweep[k]) for k in ("b2", "b8", "mocom")]
    opt = AnalysisOptions("imagefolder", str(sweep["data"]), max_images=4, knn_train=6, knn_k=5)
    results = analyze(paths, opt)
    assert sum(calls) == 3 * (6 + 4)  # every reference and query image of every model
    assert [r.label for r in results] == ["b2", "b8", "mocom"]
    assert [r.beta for r in results] == [2.0, 8.0, math.inf]  # from each run's config.yaml
    assert len({round(float(r.values.mean()), 6) for r in results}) == 3  # distinct models
    assert all(r.top1 is not None and 0 <= r.top1 <= 100 for r in results)
    written = write_outputs(results, str(tmp_path / "out"), views=32)
    assert set(written) == {"hist", "beta", "accuracy"}
    for w in written.values():
        assert Path(w.png).with_suffix(".csv") == Path(w.csv)
        assert_png_not_blank(w.png)
        assert w.plotted == len(read_csv(w.csv).rows), w
    assert written["hist"].plotted == 3 * 4
    beta_rows = read_csv(written["beta"].csv).rows
    assert [r["beta"] for r in beta_rows] == ["2", "8", "inf"]
    assert float(beta_rows[0]["mean_nuclear_norm"]) == pytest.approx(results[0].values.mean(), 1e-3)


def test_cli_fashion_mnist_with_accuracy_csv_and_checkpoint_file(sweep, tmp_path, capsys):
    """The tool on Fashion-MNIST idx files, a run folder and a checkpoint file, accuracies read
    from a CSV shaped like knn.csv, custom labels."""
    fm = make_fashion_mnist(tmp_path / "fm")
    acc = tmp_path / "acc.csv"
    acc.write_text("Model,fashion-mnist kNN top-1,k\nLORAC-b2,71.50,200\nMoCo-M,69.25,200\n")
    out = tmp_path / "out"
    rc = analyze_main(
        [
            str(sweep["b2"]),
            str(sweep["mocom"] / "model_final.pth"),
            "--dataset",
            "fashion-mnist",
            "--data-root",
            str(fm),
            "--out",
            str(out),
            "--max-images",
            "3",
            "--labels",
            "LORAC-b2",
            "MoCo-M",
            "--accuracy-csv",
            str(acc),
            "--num-workers",
            "0",
        ]
    )
    assert rc == 0, capsys.readouterr().err
    rows = read_csv(str(out / "accuracy_vs_nuclear_norm.csv")).rows
    assert [(r["model"], r["top1"], r["beta"]) for r in rows] == [
        ("LORAC-b2", "71.50", "2"),
        ("MoCo-M", "69.25", "inf"),
    ]
    assert len(read_csv(str(out / "nuclear_norm_hist.csv")).rows) == 2 * 3
    for stem in ("nuclear_norm_hist", "nuclear_norm_vs_beta", "accuracy_vs_nuclear_norm"):
        assert_png_not_blank(out / f"{stem}.png")


def test_errors_name_the_file(sweep, tmp_path, capsys):
    data = str(sweep["data"])
    lone = tmp_path / "lone"
    lone.mkdir()
    (lone / "model.pth").write_bytes((sweep["b2"] / "model_final.pth").read_bytes())
    with pytest.raises(AnalysisError, match="config.yaml"):
        load_pretrained(str(lone / "model.pth"))
    # weights of another architecture (embedding dim 8 instead of 16) under the run's config
    wrong = tmp_path / "wrong"
    make_run(wrong, sweep["data"], seed=0, **{"MODEL.HEAD_OUT_DIM": 8})
    (wrong / "config.yaml").write_text((sweep["b2"] / "config.yaml").read_text())
    with pytest.raises(AnalysisError, match=r"model_final\.pth: weights do not fit"):
        load_pretrained(str(wrong))
    bad_acc = tmp_path / "bad.csv"
    bad_acc.write_text("name,score\nb2,50\n")
    opt = AnalysisOptions("imagefolder", data, max_images=1, accuracy_csv=str(bad_acc))
    with pytest.raises(AnalysisError, match=r"bad\.csv: needs a key column"):
        analyze([str(sweep["b2"])], opt)
    nomatch = tmp_path / "nomatch.csv"
    nomatch.write_text("label,top1\nsomething-else,50\n")
    opt = AnalysisOptions("imagefolder", data, max_images=1, accuracy_csv=str(nomatch))
    with pytest.raises(AnalysisError, match="no row matches"):
        analyze([str(sweep["b2"])], opt)
    with pytest.raises(AnalysisError, match="--labels gives 1 names for 2 models"):
        analyze(
            [str(sweep["b2"]), str(sweep["b8"])], AnalysisOptions("imagefolder", data, labels=["x"])
        )
    rc = exit_status(
        analyze_main,
        [
            str(tmp_path / "missing"),
            "--dataset",
            "imagefolder",
            "--data-root",
            data,
            "--out",
            str(tmp_path / "o"),
        ],
    )
    assert rc == 2
    assert "missing: no such run directory or checkpoint file" in capsys.readouterr().err


def test_evenly_spaced_keeps_every_class():
    idx = evenly_spaced(100, 10)
    assert len(set(idx)) == 10 and idx[0] == 0 and idx[-1] == 99
    assert evenly_spaced(5, 0) == list(range(5)) and evenly_spaced(5, 9) == list(range(5))
