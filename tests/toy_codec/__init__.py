"""A server-decoded codec and its scheme from outside kvstore_ext, in NumPy only: what
tests/test_codec_walk.py runs through a real 2-worker job to show that a new codec
edits no shared file (docs/ADDING_A_SCHEME.md). On PYTHONPATH for the job's workers
and servers (the servers import it because its class decodes in NumPy:
transport/server.py)."""
