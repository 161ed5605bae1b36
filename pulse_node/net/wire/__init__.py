"""The wire worker (py-libp2p, trio): the data plane's messages, serving the store to peers,
fetching from them, and the node's typed client of that worker.
"""
