"""``pulse-node doctor`` and ``keygen``: checks that pass on this machine, and a dead bootstrap that must fail."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from types import SimpleNamespace

import pytest

from pulse_node.chain.identity import Identity
from pulse_node.ops.checks import address_scope, check_disk, dependency_problems
from pulse_node.ops.doctor import DoctorOptions, check_clocks, check_reachable

PULSE = [sys.executable, "-m", "pulse_node"]


def _doctor(*args: str, timeout: float = 90) -> tuple[int, dict]:
    r = subprocess.run([*PULSE, "doctor", "--json", *args], capture_output=True, text=True, timeout=timeout)
    return r.returncode, {c["name"]: c for c in json.loads(r.stdout)}


@pytest.mark.slow
def test_environment_checks_pass_here(tmp_path) -> None:
    code, checks = _doctor("--data-dir", str(tmp_path), "--only", "python", "--only", "libp2p",
                           "--only", "dependencies", "--only", "disk", "--only", "identity")
    assert code == 0, checks
    assert [c["status"] for c in checks.values()] == ["PASS"] * 5
    assert checks["libp2p"]["detail"] == "libp2p 0.8.1 imports"


@pytest.mark.slow
def test_dead_bootstrap_fails_with_a_next_step_while_the_local_daemon_passes(tmp_path) -> None:
    with socket.socket() as s:  # a port nobody listens on any more
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    peer = "12D3KooWMUYoksi18CJp44ErBCbEoUe5pvdyyKo25XXHFMMcQnac"
    code, checks = _doctor("--bootstrap", f"/ip4/127.0.0.1/tcp/{port}/p2p/{peer}", "--timeout", "3",
                           "--listen", "/ip4/127.0.0.1/tcp/0", "--data-dir", str(tmp_path),
                           "--only", "daemon", "--only", "bootstrap", "--only", "clocks")
    assert code == 1
    assert checks["daemon"]["status"] == "PASS"  # so the fault is not on this machine
    assert checks["bootstrap"]["status"] == "FAIL" and "refused" in checks["bootstrap"]["detail"]
    assert "check the address" in checks["bootstrap"]["fix"]
    assert checks["clocks"]["status"] == "SKIP"


@pytest.mark.slow
def test_malformed_bootstrap_address_is_a_config_failure(tmp_path) -> None:
    code, checks = _doctor("--bootstrap", "/ip4/127.0.0.1/tcp/1", "--timeout", "2", "--only", "bootstrap")
    assert code == 1 and checks["bootstrap"]["status"] == "FAIL"
    assert "/p2p/" in checks["bootstrap"]["detail"] + checks["bootstrap"]["fix"]


def test_clock_skew_and_address_scopes() -> None:
    now = 1_000_000.0
    peer = lambda dt: SimpleNamespace(role="trainer", peer_id="12D3KooWabcdefgh", updated_at=now + dt)  # noqa: E731
    assert check_clocks([peer(-5), peer(2)], now=now).status == "PASS"
    ahead = check_clocks([peer(-5), peer(45)], now=now)
    assert ahead.status == "WARN" and "45 s ahead" in ahead.detail and "NTP" in ahead.fix
    assert check_clocks([peer(-300)], now=now).status == "WARN"
    assert check_clocks([], now=now).status == "SKIP"
    assert [address_scope(a) for a in ("/ip4/8.8.8.8/tcp/1", "/ip4/10.1.2.3/tcp/1", "/ip4/127.0.0.1/tcp/1",
                                       "/dns4/example.org/tcp/1", "/ip4/1.2.3.4/tcp/1/p2p/X/p2p-circuit")] == [
        "public", "private", "loopback", "dns", "relay"]


def test_private_addresses_with_a_public_bootstrap_warn_with_what_works_behind_a_nat() -> None:
    pid = "12D3KooWMUYoksi18CJp44ErBCbEoUe5pvdyyKo25XXHFMMcQnac"
    client = SimpleNamespace(info=lambda: SimpleNamespace(visible_maddrs=[f"/ip4/192.168.1.5/tcp/4001/p2p/{pid}"]))
    check = check_reachable(client, DoctorOptions(bootstrap=[f"/ip4/8.8.8.8/tcp/31337/p2p/{pid}"]))
    assert check.status == "WARN"
    assert "inference node works anyway" in check.fix and "net.dht_listen" in check.fix and "--announce" in check.fix


def test_dependency_and_disk_checks(tmp_path) -> None:
    assert dependency_problems() == []
    assert check_disk(tmp_path / "not" / "yet").status in ("PASS", "WARN")


def test_keygen_creates_once_and_shows_the_peer_id(tmp_path, capsys) -> None:
    from pulse_node.cli import main
    from pulse_node.net.dht.validator import peer_id_of

    key = tmp_path / "node.key"
    assert main(["keygen", str(key), "--show"]) == 1 and not key.exists()
    assert "not found" in capsys.readouterr().err
    assert main(["keygen", str(key)]) == 0
    first = capsys.readouterr()
    assert main(["keygen", str(key), "--show"]) == 0
    again = capsys.readouterr()
    assert first.out == again.out and "created" in first.err and "existing" in again.err
    fields = dict(line.split(" ", 1) for line in first.out.splitlines())
    ident = Identity.load(key)
    assert fields == {"public_key": ident.public_key_hex, "peer_id": peer_id_of(ident)}
    assert (key.stat().st_mode & 0o777) == 0o600
