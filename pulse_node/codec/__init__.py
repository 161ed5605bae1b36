"""PULSESync codec: torch-free raw tensor bits, lossless sparse patches, state hashes."""
