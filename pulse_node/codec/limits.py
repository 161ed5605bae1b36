"""The largest patch this node accepts: bounded by its own model, never by a peer's number.

A version record signs its patch's size (``patch_bytes``), but a signature only says who made
the number: in an open trainer set any peer is a member, and a record may declare up to 2^63 - 1
bytes. Anything sized from it (the streaming buffer, a download's cap, the file read back) is
therefore checked first against ``patch_cap`` of the state the patch applies to.

Why twice the dense size: the coded payload of a tensor is at most about 1.1x its dense bytes
even when every entry changes to random bits (1.02-1.10x measured for BF16, F16 and F32 in both
modes, ``tests/test_peer_sizes.py``; an honest fully changed state codes to ~1.04x), and the
header (tensor entries, value tables: at most 4096 counts per table) adds tens of KiB, which the
constant ``HEADER_SLACK`` covers for small models. Catch-up patches use the same cap.
"""

from __future__ import annotations

from collections.abc import Mapping

from pulse_node.codec.state import TensorBits, state_nbytes
from pulse_node.errors import PatchError

#: room for a patch header beyond the payload bound (a tiny model's header is most of its patch)
HEADER_SLACK = 1 << 20
#: a patch may be this many times the dense size of the state it applies to, plus the slack
DENSE_FACTOR = 2


def patch_cap(state: Mapping[str, TensorBits]) -> int:
    """The most bytes a patch (or catch-up patch) applying to ``state`` may have."""
    return patch_cap_of(state_nbytes(state))


def patch_cap_of(dense_bytes: int) -> int:
    """``patch_cap`` of a state of ``dense_bytes`` dense bytes (e.g. 2 B per BF16 weight)."""
    return DENSE_FACTOR * dense_bytes + HEADER_SLACK


def check_patch_size(size: int, state: Mapping[str, TensorBits], *, what: str = "patch") -> None:
    """``PatchError`` if ``size`` (a signed or declared size) is past ``patch_cap(state)``."""
    cap = patch_cap(state)
    if not 0 <= size <= cap:
        raise PatchError(f"{what} declares {size} bytes; a patch of this model is at most {cap} "
                         f"({DENSE_FACTOR}x its dense size + {HEADER_SLACK >> 20} MiB)")
