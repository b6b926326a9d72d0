"""The one YAML reader (pretrain/utils/yaml_files.py): each way a file cannot be read as YAML is
one ConfigError line naming the file (and the line and column where there is one)."""

from __future__ import annotations

import pytest
import torch

from pretrain.utils.errors import ConfigError, ResultsError
from pretrain.utils.yaml_files import read_yaml


def test_a_utf8_file_reads(tmp_path):
    path = tmp_path / "ok.yaml"
    path.write_text("SEED: 1\n# café\n", encoding="utf-8")
    assert read_yaml(str(path)) == {"SEED": 1}
    (tmp_path / "empty.yaml").write_text("")
    assert read_yaml(str(tmp_path / "empty.yaml")) is None


@pytest.mark.parametrize(
    "name,content,message",
    [
        (
            "latin.yaml",
            "A: 1\nB: é\n".encode("latin-1"),
            "latin.yaml:2:4: not UTF-8 text: byte 0xe9",
        ),
        ("tab.yaml", b"A:\n\tB: 1\n", "tab.yaml:2:1: invalid YAML: found character '\\t'"),
        ("bin.yaml", b"A: 1\x00\x01", "bin.yaml is not a YAML config: it is binary data"),
        ("m.pkl", b"\x80\x04K\x01.", "m.pkl is not a YAML config: it looks like a checkpoint"),
    ],
)
def test_each_unreadable_file_is_one_line(tmp_path, name, content, message):
    path = tmp_path / name
    path.write_bytes(content)
    with pytest.raises(ConfigError) as e:
        read_yaml(str(path))
    assert message in str(e.value)
    assert "\n" not in str(e.value)


def test_a_torch_checkpoint_is_named_as_one_and_the_error_class_is_the_callers(tmp_path):
    path = tmp_path / "model_final.pth"
    torch.save({"model": {}}, path)
    with pytest.raises(ResultsError, match="model_final.pth is not a YAML run config: it looks"):
        read_yaml(str(path), "run config", ResultsError)
    with pytest.raises(ConfigError, match="nowhere.yaml: no such config file"):
        read_yaml(str(tmp_path / "nowhere.yaml"))
