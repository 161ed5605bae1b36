"""Atomic writes (``pulse_node/fsutil.py``): the old file or the whole new one, never a torn one."""

from __future__ import annotations

import stat

import pytest

from pulse_node.fsutil import atomic_writer, write_atomic


@pytest.mark.parametrize("durable", [True, False])
def test_write_replaces_whole_file_and_leaves_no_temp(tmp_path, durable):
    path = tmp_path / "sub" / "f.bin"
    write_atomic(path, b"old", durable=durable)
    write_atomic(path, b"new contents", durable=durable)
    assert path.read_bytes() == b"new contents"
    assert [p.name for p in path.parent.iterdir()] == ["f.bin"]


def test_failed_write_keeps_the_old_file(tmp_path):
    path = tmp_path / "f.bin"
    write_atomic(path, b"old")
    with pytest.raises(RuntimeError), atomic_writer(path) as fh:
        fh.write(b"half of the new")
        raise RuntimeError("cut")
    assert path.read_bytes() == b"old" and [p.name for p in tmp_path.iterdir()] == ["f.bin"]


def test_exclusive_never_replaces_and_mode_is_kept(tmp_path):
    path = tmp_path / "key"
    with atomic_writer(path, mode=0o600, exclusive=True) as fh:
        fh.write(b"first")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    with pytest.raises(FileExistsError), atomic_writer(path, exclusive=True) as fh:
        fh.write(b"second")
    assert path.read_bytes() == b"first" and [p.name for p in tmp_path.iterdir()] == ["key"]
