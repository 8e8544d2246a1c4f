"""Transports move payloads between workers and return the float32 sum.

``local``: one process, rank 0 of 1 (no launcher): the payload is decoded exactly as a
server would. ``ps``: MXNet's parameter server (ps-lite), chosen when the process was
started as a worker by a launcher (``DMLC_ROLE=worker``).
"""
import os


def create_transport(store):
    if os.environ.get('DMLC_ROLE') == 'worker':
        from .ps import PSTransport
        return PSTransport()
    from .local import LocalTransport
    return LocalTransport()
