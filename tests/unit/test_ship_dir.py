"""The folder the Spark job's zips are written to must be this user's alone.

Its name in the shared temp folder is guessable, so a folder someone else made first, a symlink
or a folder others may write to is refused with one line instead of being written into.
"""

from __future__ import annotations

import os
import stat

import pytest

from enhydra.spark import ship
from enhydra.spark.ship import ShipError


@pytest.fixture
def tmp(tmp_path, monkeypatch):
    monkeypatch.setattr(ship.tempfile, "gettempdir", lambda: str(tmp_path))
    return tmp_path


def ours(tmp) -> str:
    return str(tmp / f"enhydra-ship-{os.getuid()}")


def test_a_fresh_folder_is_made_private_and_used(tmp):
    path = ship._write(b"code", "job")
    assert path.read_bytes() == b"code"
    assert stat.S_IMODE(os.lstat(ours(tmp)).st_mode) & 0o077 == 0
    assert ship._write(b"code", "job") == path  # same content, same file


def test_a_symlink_in_its_place_is_refused(tmp):
    elsewhere = tmp / "theirs"
    elsewhere.mkdir(mode=0o700)
    os.symlink(elsewhere, ours(tmp))
    with pytest.raises(ShipError, match="not a plain directory"):
        ship._write(b"code", "job")
    assert list(elsewhere.iterdir()) == []


def test_a_folder_others_may_write_to_is_refused(tmp):
    os.mkdir(ours(tmp))
    os.chmod(ours(tmp), 0o777)
    with pytest.raises(ShipError, match="writable by others"):
        ship._write(b"code", "job")


def test_a_folder_of_another_user_is_refused(tmp, monkeypatch):
    real = os.getuid()
    os.mkdir(tmp / f"enhydra-ship-{real + 1}", mode=0o700)  # made by us, "owned" by real
    monkeypatch.setattr(ship.os, "getuid", lambda: real + 1)
    with pytest.raises(ShipError, match=f"another user \\(uid {real}\\)"):
        ship._write(b"code", "job")
