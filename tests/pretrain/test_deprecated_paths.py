"""pretrain/ holds rooms only, each saying what lives there and what it may import; the module
names that stood at its root until 2026-11 still import, as the very same module, with a
DeprecationWarning naming the new one."""

from __future__ import annotations

import importlib
import sys
import warnings

import pytest

import pretrain
from tests.helpers import ROOT

MOVED = sorted(pretrain._MOVED.items())


def test_pretrain_root_holds_only_rooms():
    loose = sorted(p.name for p in (ROOT / "pretrain").glob("*.py"))
    assert loose == ["__init__.py"]
    rooms = sorted(p.parent.name for p in (ROOT / "pretrain").glob("*/__init__.py"))
    assert {"utils", "config", "checkpoint", "losses", "engine", "modeling", "data"} <= set(rooms)


@pytest.mark.parametrize("room", sorted((ROOT / "pretrain").glob("*/__init__.py")), ids=str)
def test_every_room_says_what_it_may_import(room):
    doc = importlib.import_module(f"pretrain.{room.parent.name}").__doc__ or ""
    assert "May import" in doc, f"{room}: the docstring does not say what the room may import"


@pytest.mark.parametrize(("old", "new"), MOVED)
def test_old_name_is_the_new_module_with_a_warning(old, new, monkeypatch):
    for name in (old, new):
        monkeypatch.delitem(sys.modules, name, raising=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        module = importlib.import_module(old)
    assert module is importlib.import_module(new)
    assert any(
        issubclass(w.category, DeprecationWarning) and new in str(w.message) for w in caught
    ), [str(w.message) for w in caught]


def test_functional_loss_api_stays_importable_from_the_package():
    from pretrain.losses import lorac_loss, multicrop_lorac_loss, nuclear_norm

    assert callable(lorac_loss) and callable(multicrop_lorac_loss) and callable(nuclear_norm)
