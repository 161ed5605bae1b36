"""Network workers and their local API.

hivemind (asyncio + its bundled Go ``p2pd``) and py-libp2p (trio) cannot share a Python
process (both register the protobuf package ``crypto.pb``), so each runs in its own worker
process started with ``subprocess`` (never fork). The node process talks to each worker over a
Unix socket with one local RPC layer: frames and errors as data (``ipc.py``), one server and
worker runtime (``rpc_server.py``), one client base (``process.py``), each worker's config one
model (``worker_config.py``). Bulk data moves as files in the node's store, never through the
socket.
"""
