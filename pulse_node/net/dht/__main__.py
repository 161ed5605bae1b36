"""``python -m pulse_node.net.dht``: the DHT worker's process, as ``DhtClient`` starts it.

hivemind's DHT and p2p modules are loaded first without torch (``hivemind_core``), then the worker
runs (``worker.main``): its imports cost a seventh of the CPU they did (bench/RESULTS.md,
"Suite time").
"""

from __future__ import annotations

import sys

from pulse_node.net.dht.hivemind_core import load_core

if __name__ == "__main__":
    load_core()
    from pulse_node.net.dht.worker import main

    sys.exit(main())
