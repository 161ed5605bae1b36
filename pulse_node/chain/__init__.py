"""Version chain: signed version records, the on-disk version store, reordering, catch-up.

Pure and torch-free. Modules:

- ``identity``  Ed25519 node identity (persistent key file) and signature checks.
- ``record``    ``VersionRecord``: the signed, hash-chained description of one model version.
- ``store``     ``VersionStore``: anchors, patches and records on disk, crash-safe.
- ``layout``    the store's file layout and cheap file checks (shared with read-only readers).
- ``reorder``   ``ReorderBuffer``: turns out-of-order arrivals into an in-order stream.
- ``catchup``   one patch from version a to version b for peers that fell behind.
- ``patchinfo`` the base/result state hashes a codec patch header names.
"""
