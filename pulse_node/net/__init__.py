"""Network workers and their local APIs.

hivemind (asyncio + its bundled Go ``p2pd``) and py-libp2p (trio) cannot share a Python
process (both register the protobuf package ``crypto.pb``), so each runs in its own worker
process started with ``subprocess`` (never fork). The node process talks to each worker over a
Unix socket with the framed msgpack RPC in ``ipc.py``; bulk data moves as files in the node's
store, never through the socket.
"""
