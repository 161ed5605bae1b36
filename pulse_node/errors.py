"""Typed errors shared by every layer.

Every failure that can be caused by input (a file, a peer, a flag) is one of these, with a
message a user can act on. The CLI prints ``str(error)`` on one line and exits non-zero.
"""

from __future__ import annotations


class PulseError(Exception):
    """Base class: an expected failure with a human-readable message."""


class ConfigError(PulseError):
    """A configuration file or flag is invalid."""


class PatchError(PulseError):
    """A patch is malformed, corrupt, truncated or oversized."""


class BaseMismatchError(PatchError):
    """A patch was applied to a state other than the one it was made for."""


class IntegrityError(PulseError):
    """A hash or signature check failed."""


class StoreError(PulseError):
    """The on-disk version store cannot satisfy a request."""


class GapError(PulseError):
    """A version chain has a hole that the caller must fill (anchor or catch-up patch)."""


class BusyError(PulseError):
    """A peer is working on the request (or is at capacity); the same request may succeed shortly."""


class WireError(PulseError):
    """A message from a peer is malformed or violates the protocol."""


class DataError(PulseError):
    """A data file (tasks, model directory) is malformed; the message names file and line."""


class PeerUnavailable(WireError):
    """A peer could not be reached, went away, was busy, or did not answer in time."""


class PeerBusy(PeerUnavailable, BusyError):
    """The peer is working on the request (e.g. making a catch-up patch); ask again shortly."""


class NotFound(WireError):
    """The peer does not hold the requested file."""


class UnsupportedVersion(WireError):
    """The peer speaks another wire version."""
