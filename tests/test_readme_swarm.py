"""The README's "Joining a real swarm" commands, run as written, form one swarm.

The bootstrap and join commands are read from README.md and run as processes with only what a
test on a shared machine must change: ``<PUBLIC_IP>`` and ``0.0.0.0`` become 127.0.0.1, the port
the README names becomes one the OS just handed out, ``<PEER_ID>`` is the id the bootstrap
printed, ``<TRAINER_KEY_n>`` are fresh trainer keys, the config path is the checkout's, and the joining node listens on loopback (port 0).
Neither command names a run id: the swarm forms only if both default to the same one.
"""

from __future__ import annotations

import re
import shlex
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import wait_for

from tests.test_net_dht import read_maddr_line

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]
ROOT = Path(__file__).resolve().parents[1]
PULSE_NODE = str(Path(sys.executable).with_name("pulse-node"))


def readme_commands() -> tuple[str, str]:
    """The bootstrap and join commands of the README's "Joining a real swarm" section."""
    section = ROOT.joinpath("README.md").read_text().split("## Joining a real swarm", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```bash\n(.*?)```", section, re.DOTALL)
    lines = [b.replace("\\\n", " ").strip() for b in blocks]
    boot = next(line for line in lines if line.startswith("pulse-node bootstrap"))
    join = next(line for line in lines if line.startswith("pulse-node join ") and "<PEER_ID>" in line)
    return boot, join


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def localize(command: str, port: int, peer_id: str = "", keys: tuple[str, ...] = ()) -> list[str]:
    for i, key in enumerate(keys, 1):
        command = command.replace(f"<TRAINER_KEY_{i}>", key)
    text = (command.replace("<PUBLIC_IP>", "127.0.0.1").replace("0.0.0.0", "127.0.0.1")
            .replace("31337", str(port)).replace("<PEER_ID>", peer_id)
            .replace("configs/", f"{ROOT}/configs/"))
    argv = shlex.split(text)
    assert argv[0] == "pulse-node"
    return [PULSE_NODE, *argv[1:]]


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


def test_readme_bootstrap_and_join_form_one_swarm(tmp_path: Path) -> None:
    from pulse_node.chain.identity import Identity
    from pulse_node.net.dht.client import DhtClient, DhtConfig

    boot_cmd, join_cmd = readme_commands()
    port = free_port()
    boot = subprocess.Popen(localize(boot_cmd, port), cwd=tmp_path, stdout=subprocess.PIPE,
                            stderr=open(tmp_path / "bootstrap.err", "w"), text=True)
    join = None
    try:
        maddr = read_maddr_line(boot, 90)
        assert maddr.startswith(f"/ip4/127.0.0.1/tcp/{port}/p2p/")
        run = re.search(r"ready, run (\S+),", (tmp_path / "bootstrap.err").read_text()).group(1)
        loopback = ["--set", 'net.dht_listen=["/ip4/127.0.0.1/tcp/0"]', "--set", 'net.wire_listen=["/ip4/127.0.0.1/tcp/0"]']
        keys = tuple(Identity.generate().public_key_hex for _ in range(join_cmd.count("<TRAINER_KEY_")))
        join = subprocess.Popen([*localize(join_cmd, port, maddr.rsplit("/p2p/", 1)[1], keys), *loopback], cwd=tmp_path,
                                stdout=subprocess.DEVNULL, stderr=open(tmp_path / "join.err", "w"))
        with DhtClient.start(DhtConfig(run_id=run, initial_peers=[maddr], client_mode=True,
                                       host_maddrs=["/ip4/127.0.0.1/tcp/0"])) as observer:
            def joined() -> bool:
                assert join.poll() is None, (tmp_path / "join.err").read_text()[-3000:]
                return "inference" in {p.role for p in observer.peers()}

            wait_for(joined, timeout=180, interval=0.5,
                     what=f"the joined inference node's record in run {run!r}, found through the bootstrap")
    finally:
        if join is not None:
            stop(join)
        stop(boot)
