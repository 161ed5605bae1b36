"""The local RPC between the node process and its worker processes: frames, errors as data,
the server and client sides, each worker's config, and the spool and inbox both workers share.
"""
