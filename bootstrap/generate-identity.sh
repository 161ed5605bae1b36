#!/bin/sh
# Create (once) the bootstrap's persistent identity and print the address nodes must use.
#
#   bootstrap/generate-identity.sh /var/lib/pulse-node/bootstrap.key 203.0.113.10 [31337]
#
# Re-running it never replaces an existing key: the peer id, and hence the address every node
# is configured with, stays the same. Keep the key private (mode 0600) and never copy it to a
# second machine: two live nodes with one identity are refused by the swarm.
set -eu
KEY=${1:?usage: generate-identity.sh KEY_FILE PUBLIC_IP [PORT]}
IP=${2:?usage: generate-identity.sh KEY_FILE PUBLIC_IP [PORT]}
PORT=${3:-31337}
PEER_ID=$(pulse-node keygen "$KEY" | awk '$1 == "peer_id" {print $2}')
[ -n "$PEER_ID" ] || { echo "generate-identity: could not read the peer id of $KEY" >&2; exit 1; }
echo "/ip4/$IP/tcp/$PORT/p2p/$PEER_ID"
