"""Network workers and their local API, one folder per thing.

hivemind (asyncio + its bundled Go ``p2pd``) and py-libp2p (trio) cannot share a Python
process (both register the protobuf package ``crypto.pb``), so each runs in its own worker
process started with ``subprocess`` (never fork).

- ``local/``: the local RPC between the node process and each worker over a Unix socket (frames
  and errors as data, one server and worker runtime, one client base), the fields every worker's
  config shares, and the spool and inbox both workers use. Bulk data crosses as files.
- ``dht/``: the DHT worker (hivemind): peer records and who may write them, joining, the p2pd
  push plane, its config and its typed client.
- ``wire/``: the wire worker (py-libp2p): the data plane's messages, serving and fetching, its
  config and its typed client.
- ``peers/``: what a peer may do here: its budget on the data plane, its earned standing.

Imports go one way: ``peers`` <- ``local`` <- ``wire`` <- ``dht`` (the DHT push plane reuses the
wire protocol's message caps); ``tests/test_house.py`` enforces it.
"""
