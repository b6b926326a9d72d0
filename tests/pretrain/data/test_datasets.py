"""The readers shared by pretraining and the evaluations (pretrain.data.datasets): class lists,
image folders, Fashion-MNIST, the RGB decoder and the dataset-type names."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from pretrain.config.defaults import ConfigError, load_config
from pretrain.data.datasets import (
    FASHION_MNIST,
    IMAGEFILES,
    IMAGEFOLDER,
    BadImageError,
    DatasetError,
    FashionMNISTSource,
    ImageFilesSource,
    ImageFolderSource,
    TransformedDataset,
    build_source,
    dataset_type,
    decodes,
    load_image,
    read_class_list,
    to_rgb,
)
from tests.helpers import make_image_folder, tiny_opts
from tests.helpers.classification import make_knn_fashion_mnist
from transfer.classification.datasets import build_image_folder
from transfer.classification.demo import DEMO_CONFIG
from transfer.classification.transforms import ToRGB


def test_class_list_allows_comments_and_blank_lines(tmp_path):
    spec = tmp_path / "classes.txt"
    spec.write_text("# two of three\nn01440764\n\n  n01484850  # the second one\n#n09999999\n")
    assert read_class_list(str(spec)) == ["n01440764", "n01484850"]


def test_class_list_duplicate_is_an_error_naming_file_and_class(tmp_path):
    spec = tmp_path / "dup.txt"
    spec.write_text("n01440764\nn01484850\nn01440764 # again\n")
    with pytest.raises(DatasetError, match=r"dup\.txt: class 'n01440764' is listed twice"):
        read_class_list(str(spec))


def test_class_list_missing_empty_and_shipped(tmp_path):
    with pytest.raises(DatasetError, match=r"nope\.txt: no such class-list file"):
        read_class_list(str(tmp_path / "nope.txt"))
    (tmp_path / "empty.txt").write_text("# nothing\n\n")
    with pytest.raises(DatasetError, match=r"empty\.txt: class-list file lists no classes"):
        read_class_list(str(tmp_path / "empty.txt"))
    in100 = read_class_list("imagenet100")
    assert len(in100) == len(set(in100)) == 100


def test_image_folder_skips_hidden_and_filters_extensions_on_request(tmp_path):
    """Proves pretraining's rule (every visible file is a sample, so a stray file is reported
    when it fails to decode) and the evaluations' (image extensions only) on one folder."""
    root = make_image_folder(tmp_path / "data", classes=2, per_class=3)
    (root / "class0" / "notes.txt").write_text("not an image")
    (root / "class1" / ".hidden.png").write_bytes((root / "class1" / "img0.png").read_bytes())
    (root / ".cache").mkdir()
    (root / ".cache" / "x.png").write_bytes((root / "class1" / "img0.png").read_bytes())
    every = ImageFolderSource(str(root))
    assert every.classes == ["class0", "class1"] and len(every) == 7
    assert [Path(every.describe(i)).name for i in range(4)] == [
        "img0.png",
        "img1.jpg",
        "img2.png",
        "notes.txt",
    ]
    images = build_image_folder(str(root))
    assert len(images) == 6 and images.targets == [0, 0, 0, 1, 1, 1]
    img, label = images[5]
    assert img.mode == "RGB" and label == 1
    assert every.label(5) == 1 and every.load(5).mode == "RGB"


def test_image_folder_class_list_max_images_and_keep(tmp_path):
    root = make_image_folder(tmp_path / "data", classes=3, per_class=2)
    (tmp_path / "two.txt").write_text("class2\nclass0\n")
    src = ImageFolderSource(str(root), str(tmp_path / "two.txt"))
    assert src.classes == ["class0", "class2"] and src.targets == [0, 0, 1, 1]
    assert len(ImageFolderSource(str(root), max_images=3)) == 3
    src.keep([True, False, False, True])
    assert src.targets == [0, 1] and len(src) == 2
    (tmp_path / "more.txt").write_text("class0\nclass7\n")
    with pytest.raises(DatasetError, match=r"1 classes of the class list have no folder.*class7"):
        ImageFolderSource(str(root), str(tmp_path / "more.txt"))


def test_image_folder_empty_class_allowed_only_when_asked(tmp_path):
    root = make_image_folder(tmp_path / "data", classes=2, per_class=2)
    (root / "class9").mkdir()
    assert ImageFolderSource(str(root)).classes == ["class0", "class1", "class9"]
    with pytest.raises(DatasetError, match="not an image folder.*class9"):
        build_image_folder(str(root))
    (tmp_path / "none" / "class0").mkdir(parents=True)
    with pytest.raises(DatasetError, match="none'?: not an image folder: no images"):
        ImageFolderSource(str(tmp_path / "none"))


def _sixteen_bit_png(path: Path) -> None:
    arr = (np.arange(32 * 32).reshape(32, 32) * 60).astype(np.uint16)  # up to 61380
    Image.fromarray(arr).save(path)


def test_every_reader_scales_16_bit_images_instead_of_clipping(tmp_path):
    """Proves the one RGB conversion is used by the folder readers of both sides and by the
    evaluations' ToRGB: a 16-bit PNG comes out graded, not white."""
    root = tmp_path / "deep" / "class0"
    root.mkdir(parents=True)
    _sixteen_bit_png(root / "a.png")
    with Image.open(root / "a.png") as raw:
        assert raw.mode.startswith("I;16")
        assert (np.asarray(raw.convert("RGB")) == 255).mean() > 0.9  # plain convert clips
        via_transform = np.asarray(ToRGB()(raw))
        expected = np.asarray(to_rgb(raw))
    assert expected.min() == 0 and expected.max() > 200
    for img in (
        ImageFolderSource(str(tmp_path / "deep")).load(0),
        build_image_folder(str(tmp_path / "deep"))[0][0],
        load_image(str(root / "a.png")),
    ):
        assert np.array_equal(np.asarray(img), expected)
    assert np.array_equal(via_transform, expected)


def test_decodes(tmp_path):
    root = make_image_folder(tmp_path / "data", classes=1, per_class=2)
    good = root / "class0" / "img1.jpg"
    (tmp_path / "zero.jpg").write_bytes(b"")
    (tmp_path / "half.jpg").write_bytes(good.read_bytes()[:200])
    (tmp_path / "text.png").write_text("not a png")
    assert decodes(str(good))
    for bad in ("zero.jpg", "half.jpg", "text.png", "missing.jpg"):
        assert not decodes(str(tmp_path / bad)), bad


def test_dataset_type_has_one_spelling():
    assert dataset_type("fashion_mnist") == dataset_type("fashion-mnist") == FASHION_MNIST
    assert dataset_type("imagefolder") == IMAGEFOLDER
    with pytest.raises(DatasetError, match="'mnist'"):
        dataset_type("mnist")


def test_fashion_mnist_source_is_a_dataset_and_a_pretraining_source(tmp_path):
    root = make_knn_fashion_mnist(str(tmp_path / "fm"), n_train=12, n_test=6)
    src = FashionMNISTSource(root, "train", max_images=10)
    assert len(src) == 10 and src.label(3) == 3 and len(src.classes) == 10
    img = src.load(3)
    assert img.mode == "RGB" and img.size == (28, 28)
    grey = np.asarray(img)[..., 0]
    assert np.array_equal(grey, src.images[3])  # no resize at image_size 0
    assert torch.equal(src.tensor()[3, 1], torch.from_numpy(src.images[3]))
    tf = TransformedDataset(FashionMNISTSource(root, "test", image_size=32), np.asarray, [5, 1])
    (x, y), (_, y1) = tf[0], tf[1]
    assert x.shape == (32, 32, 3) and (y, y1) == (5, 1) and len(tf) == 2
    with pytest.raises(DatasetError, match="split must be train or test"):
        FashionMNISTSource(root, "val")


def _photos(root: Path, names: list[str]) -> Path:
    """JPEG/PNG files at the given relative paths (folders created), each a distinct colour."""
    for i, name in enumerate(names):
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        Image.new("RGB", (20, 16), (10 * i, 255 - 10 * i, 128)).save(path)
    return root


def test_image_files_finds_images_at_any_depth_sorted_without_labels(tmp_path):
    """A folder of unlabelled photos (files at the top, in nested folders of any name,
    any suffix case) is a pretraining source; hidden files/folders and other files are left out;
    the order is the paths' sorted order whatever order the files were created in."""
    names = ["z.jpg", "2019/summer/b.PNG", "a.jpeg", "2019/a.JPG", "2020/x.webp", "2019/z.png"]
    root = _photos(tmp_path / "photos", names)
    (root / "2019" / "notes.txt").write_text("a sidecar")
    (root / "2020" / "x.webp.json").write_text("{}")
    _photos(root, [".hidden.jpg", ".thumbnails/t.jpg", "2020/.cache/c.png"])
    src = ImageFilesSource(str(root))
    rel = [str(Path(src.describe(i)).relative_to(root)) for i in range(len(src))]
    assert rel == [
        "2019/a.JPG", "2019/summer/b.PNG", "2019/z.png", "2020/x.webp", "a.jpeg", "z.jpg",
    ]  # fmt: skip
    assert src.classes == [] and src.label(0) == -1
    img, label = src[1]
    assert img.mode == "RGB" and img.size == (20, 16) and label == -1
    assert torch.equal(src.load_rgb(1), torch.from_numpy(np.asarray(src.load(1))))
    again = _photos(tmp_path / "copy", list(reversed(names)))  # created in the other order
    assert [Path(p).relative_to(again) for p in ImageFilesSource(str(again)).samples] == [
        Path(p).relative_to(root) for p in src.samples
    ]
    assert len(ImageFilesSource(str(root), max_images=2)) == 2


def test_image_files_unreadable_empty_missing_and_a_link_loop(tmp_path):
    root = _photos(tmp_path / "photos", ["a/good.jpg"])
    (root / "a" / "broken.jpg").write_bytes(b"not a jpeg")
    (root / "a" / "loop").symlink_to(root, target_is_directory=True)  # walked once, no loop
    src = ImageFilesSource(str(root))
    assert [Path(p).name for p in src.samples] == ["broken.jpg", "good.jpg"]
    with pytest.raises(BadImageError, match="broken.jpg"):  # skipped and counted in training
        src.load(0)
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "readme.txt").write_text("no images here")
    with pytest.raises(DatasetError, match=r"docs'?: no image files in it or its subfolders"):
        ImageFilesSource(str(tmp_path / "docs"))
    with pytest.raises(DatasetError, match="does not exist"):
        ImageFilesSource(str(tmp_path / "absent"))


def test_a_flat_folder_as_imagefolder_says_to_use_imagefiles(tmp_path):
    root = _photos(tmp_path / "photos", ["a.jpg", "b.jpg"])
    cfg = load_config(DEMO_CONFIG, tiny_opts(root, tmp_path / "out"))
    with pytest.raises(DatasetError, match="no class folders.*set DATASETS.TYPE imagefiles"):
        build_source(cfg)
    flat = load_config(
        DEMO_CONFIG, tiny_opts(root, tmp_path / "out", **{"DATASETS.TYPE": IMAGEFILES})
    )
    assert isinstance(build_source(flat), ImageFilesSource) and len(build_source(flat)) == 2


def test_imagefiles_is_for_pretraining_only_and_has_no_classes(tmp_path):
    with pytest.raises(DatasetError, match="'imagefiles': expected one of imagefolder"):
        dataset_type(IMAGEFILES)  # the evaluations need labels
    opts = tiny_opts(tmp_path, tmp_path / "out", **{"DATASETS.TYPE": IMAGEFILES})
    with pytest.raises(ConfigError, match="DATASETS.CLASS_LIST = 'imagenet100': DATASETS.TYPE"):
        load_config(DEMO_CONFIG, [*opts, "DATASETS.CLASS_LIST", "imagenet100"])
    with pytest.raises(ConfigError, match="TEST.KNN_ROOT = '': the kNN monitor .* imagefiles run"):
        load_config(DEMO_CONFIG, [*opts, "TEST.KNN_PERIOD", "5"])
