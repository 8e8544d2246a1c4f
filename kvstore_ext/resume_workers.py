"""A checkpoint is resumed by a job with the number of workers that saved it, or not
at all.

Why: a worker's file holds its own error-feedback residuals (what its compressed
pushes left out so far), and the servers' files hold the residuals of their replies,
sized for the keys' slots of every worker. A job with more workers has ranks with no
state of their own; one with fewer would drop the residual mass of the missing ranks
without a word. Handing residuals over between ranks would change what the run
computes, so it is refused instead: on every worker, with one message naming the
saved and the current number of workers, before anything reaches a server (the
servers get the saved directory only with the first compressed round).

Files saved before the number of workers was recorded are not checked by number; a
rank with no file of its own is still refused, by name.
"""
import os


def check_file(fname, rank):
    """Refuse a missing state file with a message that names the rank."""
    if not os.path.isfile(fname):
        raise FileNotFoundError(
            '%s: no compression state for worker rank %d (a checkpoint holds one file per '
            'worker: a job must resume with as many workers as the job that saved it)'
            % (fname, rank))


def check_workers(meta, fname, num_workers):
    """Refuse a state saved by a job with another number of workers."""
    saved = meta.get('num_workers')
    if saved is not None and int(saved) != num_workers:
        raise ValueError(
            '%s was saved by a job of %d workers, this job has %d: residuals belong to '
            'their workers and to the servers\' slots of that many workers, so a job '
            'resumes with as many workers as saved it (nothing was loaded)'
            % (fname, saved, num_workers))
