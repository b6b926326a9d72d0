"""detectron2 ``.pkl`` weights are read with a restricted unpickler: data in, code refused."""

from __future__ import annotations

import collections
import os
import pickle
from pathlib import Path

import numpy as np
import pytest

from transfer.detection.config import DetectionSetupError
from transfer.detection.weights import (
    UnsafePickleError,
    load_d2_pickle,
    read_model_weights,
)


class _Hostile:
    """Unpickling this calls ``os.system`` (the classic pickle exploit)."""

    def __init__(self, command: str):
        self.command = command

    def __reduce__(self):
        return (os.system, (self.command,))


def _weights() -> dict:
    return {
        "model": {
            "backbone.bottom_up.stem.conv1.weight": np.random.rand(4, 3, 3, 3).astype(np.float32),
            "backbone.bottom_up.res2.0.conv1.norm.running_var": np.arange(4, dtype=np.float64),
            "scale": np.float32(0.5),  # a numpy scalar
            "ids": np.array([1, 2], dtype=np.int64),
        },
        "__author__": "lorac",
        "matching_heuristics": False,
        "meta": collections.OrderedDict(layers=[1, 2.5, (3, "x"), None, True]),
        "raw": b"\x00\xffbytes",
    }


@pytest.mark.parametrize("protocol", [2, 4, pickle.HIGHEST_PROTOCOL])
def test_weights_pickles_round_trip(tmp_path, protocol):
    """What tools/convert_to_d2.py and the model zoo write (numpy arrays and scalars, plain
    containers, bytes, OrderedDict) loads as plain ``pickle.load`` would load it."""
    data = _weights()
    path = tmp_path / "w.pkl"
    path.write_bytes(pickle.dumps(data, protocol=protocol))
    back = load_d2_pickle(str(path))
    plain = pickle.loads(path.read_bytes(), encoding="latin1")
    assert back.keys() == data.keys()
    for k, v in data["model"].items():
        assert type(back["model"][k]) is type(v)
        np.testing.assert_array_equal(back["model"][k], v)
        assert back["model"][k].dtype == plain["model"][k].dtype
    assert back["meta"] == data["meta"] and isinstance(back["meta"], collections.OrderedDict)
    assert back["raw"] == data["raw"] and back["__author__"] == "lorac"
    shapes = read_model_weights(str(path))
    assert shapes["backbone.bottom_up.stem.conv1.weight"] == (4, 3, 3, 3)


@pytest.mark.parametrize("protocol", [0, 2, pickle.HIGHEST_PROTOCOL])
def test_hostile_pickle_is_refused_without_running_it(tmp_path, protocol):
    """A .pkl whose unpickling would call os.system (creating a marker file) is refused with an
    error naming the file and the global, and the command never runs."""
    marker = tmp_path / "pwned"
    path = tmp_path / "hostile.pkl"
    payload = {"x": _Hostile(f"touch {marker}"), "model": {"w": np.zeros(2)}}
    path.write_bytes(pickle.dumps(payload, protocol=protocol))
    # the payload is live: plain pickle.load would run the command
    pickle.loads(path.read_bytes())
    assert marker.exists()
    marker.unlink()

    with pytest.raises(UnsafePickleError, match=r"hostile\.pkl: refusing to unpickle") as e:
        load_d2_pickle(str(path))
    assert os.system.__module__ in str(e.value) and "system" in str(e.value)
    with pytest.raises(DetectionSetupError, match=r"MODEL.WEIGHTS .*hostile\.pkl.*system"):
        read_model_weights(str(path))
    assert not marker.exists()


@pytest.mark.parametrize(
    "obj,global_name",
    [
        (Path("/etc/passwd"), "pathlib"),  # an arbitrary class
        (collections.Counter(a=1), "collections.Counter"),  # a near-miss of OrderedDict
        (np.ma.masked_array([1, 2]), "numpy.ma"),  # numpy, but not a plain array
    ],
)
def test_other_globals_are_refused(tmp_path, obj, global_name):
    path = tmp_path / "other.pkl"
    path.write_bytes(pickle.dumps({"model": {}, "x": obj}, protocol=2))
    with pytest.raises(UnsafePickleError, match=rf"other\.pkl: refusing to unpickle {global_name}"):
        load_d2_pickle(str(path))


def test_bad_files_name_the_file(tmp_path):
    with pytest.raises(DetectionSetupError, match=r"missing\.pkl: no such file"):
        load_d2_pickle(str(tmp_path / "missing.pkl"))
    truncated = tmp_path / "truncated.pkl"
    truncated.write_bytes(pickle.dumps(_weights(), protocol=2)[:100])
    with pytest.raises(DetectionSetupError, match=r"truncated\.pkl: not a readable weights"):
        load_d2_pickle(str(truncated))
    a_list = tmp_path / "list.pkl"
    a_list.write_bytes(pickle.dumps([1, 2]))
    with pytest.raises(DetectionSetupError, match=r"list\.pkl: expected a dict.*list"):
        load_d2_pickle(str(a_list))
