"""``pulse-node patch`` end to end in subprocesses: happy path and clean failures."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from codec_strategies import realistic_pair

from pulse_node.codec.state import save_safetensors_atomic

pytestmark = pytest.mark.slow  # a pulse-node process per call


def _cli(*args: str):
    return subprocess.run([sys.executable, "-m", "pulse_node.cli", "patch", *args], capture_output=True,
                          text=True, timeout=120)


@pytest.fixture()
def files(tmp_path):
    base, new = realistic_pair(numel=20000, seed=5)
    save_safetensors_atomic(base, tmp_path / "old.safetensors")
    save_safetensors_atomic(new, tmp_path / "new.safetensors")
    return tmp_path


@pytest.mark.parametrize("mode", ["compact", "overwrite"])
def test_diff_apply_inspect(files, mode):
    r = _cli("diff", str(files / "old.safetensors"), str(files / "new.safetensors"), "-o", str(files / "p"),
             "--mode", mode)
    assert r.returncode == 0, r.stderr
    r = _cli("apply", str(files / "old.safetensors"), str(files / "p"), "-o", str(files / "out.safetensors"))
    assert r.returncode == 0, r.stderr
    assert (files / "out.safetensors").read_bytes() == (files / "new.safetensors").read_bytes()
    r = _cli("inspect", str(files / "p"), "--json")
    info = json.loads(r.stdout)
    assert info["mode"] == mode and info["changed"] > 0 and info["bytes"] == (files / "p").stat().st_size
    assert info["ratio_vs_dense_bf16"] > 1
    assert "B/change" in _cli("inspect", str(files / "p")).stdout


def _assert_clean_failure(r, out):
    assert r.returncode != 0
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "Traceback" not in r.stderr
    assert not out.exists()


def test_apply_failures(files):
    assert _cli("diff", str(files / "old.safetensors"), str(files / "new.safetensors"), "-o",
                str(files / "p")).returncode == 0
    out = files / "out.safetensors"
    _assert_clean_failure(_cli("apply", str(files / "new.safetensors"), str(files / "p"), "-o", str(out)), out)
    (files / "cut").write_bytes((files / "p").read_bytes()[:-5])
    _assert_clean_failure(_cli("apply", str(files / "old.safetensors"), str(files / "cut"), "-o", str(out)), out)
    (files / "junk.safetensors").write_bytes(b"not a safetensors file")
    _assert_clean_failure(_cli("apply", str(files / "junk.safetensors"), str(files / "p"), "-o", str(out)), out)
    _assert_clean_failure(_cli("apply", str(files / "missing"), str(files / "p"), "-o", str(out)), out)
    _assert_clean_failure(_cli("inspect", str(files / "cut")), files / "nothing")
    _assert_clean_failure(_cli("diff", str(files / "old.safetensors"), str(files / "junk.safetensors"), "-o",
                               str(out)), out)
