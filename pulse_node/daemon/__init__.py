"""Daemon plumbing: the node process, its role context, status endpoints and the transport it speaks through."""
