"""pretrain.cli.arguments: what the tools' parsers share."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from pretrain.cli.arguments import options_from_args


@dataclass
class _Options:
    dataset: str
    views: int = 32
    device: str = "cpu"


def test_options_take_the_arguments_of_their_fields_then_the_overrides():
    args = argparse.Namespace(dataset="imagefolder", device="", out="o")  # no --views, extra --out
    opt = options_from_args(_Options, args, device="cuda")
    assert opt == _Options(dataset="imagefolder", views=32, device="cuda")
