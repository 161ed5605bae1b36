"""What every worker is started with: the fields each worker's config model shares.

Each worker declares its config once, as one validated pydantic model (``net/dht/config.py``,
``net/wire/config.py``); ``process.WorkerClient.start`` writes it as JSON and the worker
(``rpc_server.run_worker``) validates the same model again from that file: there is no second
list of flags on either side. Importable without hivemind, trio or py-libp2p.
"""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import AfterValidator

from pulse_node.vocab import check_run_id

#: a run id field (``vocab.RUN_ID_RULE``) of a config model
RunId = Annotated[str, AfterValidator(check_run_id)]
LogLevel = Literal["debug", "info", "warning", "error"]
#: a full multiaddr with its peer id, as `pulse-node bootstrap` prints it
FULL_MADDR = re.compile(r"^/(ip4|ip6|dns|dns4|dns6)/[^/]+/(tcp|udp)/\d{1,5}(/quic-v1|/quic)?(/[^/]+/[^/]+)*"
                        r"/p2p/[1-9A-HJ-NP-Za-km-z]{40,64}$")
