"""``pulse-node keygen``: create (or show) a node's persistent Ed25519 identity and its libp2p peer id.

    pulse-node keygen bootstrap.key          # create if missing, print public key and peer id
    pulse-node keygen data/identity.key --show   # only read an existing key

Output is two ``name value`` lines (``public_key``, ``peer_id``) on stdout, so scripts can
``awk '/^peer_id/ {print $2}'``; whether the key was created goes to stderr. The peer id is
what a bootstrap address ends with (``/ip4/.../tcp/31337/p2p/<peer id>``). Never copy a key
file to a second machine: two live nodes with one identity are refused by the swarm.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pulse_node.chain.identity import Identity


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("keygen", help="create or show a persistent node identity (Ed25519) and its peer id",
                       description="Create PATH (PEM, mode 0600) if it does not exist, then print its public "
                       "key (hex) and libp2p peer id. With --show the key must already exist.")
    p.add_argument("path", metavar="PATH", help="identity key file (e.g. bootstrap.key or DATA_DIR/identity.key)")
    p.add_argument("--show", action="store_true", help="only read an existing key (error if missing)")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    import sys
    from pathlib import Path

    from pulse_node.chain.identity import Identity

    path = Path(args.path)
    existed = path.exists()
    identity = Identity.load(path) if args.show or existed else Identity.load_or_create(path)
    print(f"public_key {identity.public_key_hex}")
    print(f"peer_id {_peer_id(identity)}")
    print(f"pulse-node keygen: {'existing' if existed else 'created'} identity {path}", file=sys.stderr)
    return 0


def _peer_id(identity: Identity) -> str:
    try:
        from pulse_node.net.dht.validator import peer_id_of
    except ImportError:  # hivemind missing: the key is still usable, only the id cannot be shown
        return "unavailable (hivemind is not importable: see pulse-node doctor)"
    return peer_id_of(identity)
