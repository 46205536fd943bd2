"""Files of optimizer states that several processes may write at once.

Many training scripts (GluonCV's among them) call `trainer.save_states(path)` on every worker
with the same `path`. A fixed temporary name (`path + '.tmp'`) then races: one worker renames
another's temporary file away and the other's rename fails. And with one file per path, the
last worker to write would replace the others' local states. So:

* every write goes to a temporary file of its own (unique name in the same folder) and is
  renamed over the target, so a reader sees a whole old file or a whole new one;
* a worker states file holds one entry per worker rank: a worker replaces its own entry and
  keeps the others' (read, change and rename under an exclusive lock of the folder), so
  workers that share a path share the file without overwriting each other. A worker reads
  back its own entry.

Imports nothing from MXNet: the servers (odsgd/server/updater.py) write their states through
`write_atomically` while `import mxnet` is still running there.
"""
import contextlib
import fcntl
import logging
import os
import pickle
import tempfile

LOG = logging.getLogger("odsgd")

#: format of a worker states file: {"format": 4, "workers": {rank: that worker's states}}
WORKER_FILE_FORMAT = 4
#: the format of one worker's states (the dict save_optimizer_states builds)
WORKER_STATES_FORMAT = 5


def replace_atomically(path, write):
    """Writes `path` through a temporary file of this call's own in the same folder, renamed
    over `path`: `write(temporary)` writes the file by its name. A write cut short leaves
    `path` as it was, and no temporary file."""
    folder = os.path.dirname(os.path.abspath(path))
    handle, temporary = tempfile.mkstemp(dir=folder, prefix=os.path.basename(path) + ".",
                                         suffix=".tmp")
    os.close(handle)
    try:
        write(temporary)
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise


def write_atomically(path, value):
    """Pickles `value` into `path` through a temporary file of this call's own."""
    def pickled(temporary):
        with open(temporary, "wb") as f:
            pickle.dump(value, f, protocol=pickle.HIGHEST_PROTOCOL)
    replace_atomically(path, pickled)


@contextlib.contextmanager
def _folder_locked(path):
    """An exclusive lock of the folder of `path` (flock on the folder itself, so no lock file
    is left beside the checkpoints), for processes on this machine or a shared file system
    that supports flock."""
    descriptor = os.open(os.path.dirname(os.path.abspath(path)), os.O_RDONLY)
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX)
        yield
    finally:
        os.close(descriptor)   # releases the lock


def _entries(path):
    """{rank: states} held by the worker states file `path` ({} if there is none)."""
    if not os.path.exists(path):
        return {}
    with open(path, "rb") as f:
        saved = pickle.load(f)
    if isinstance(saved, dict) and saved.get("format") == WORKER_FILE_FORMAT:
        return saved["workers"]
    if isinstance(saved, dict) and saved.get("format") == WORKER_STATES_FORMAT:
        return {saved.get("rank", 0): saved}   # one worker's file, as earlier versions wrote
    raise ValueError("%s is not a dist_odsgd worker states file (format %r); this version "
                     "reads formats %d and %d" % (path, saved.get("format") if
                                                  isinstance(saved, dict) else None,
                                                  WORKER_STATES_FORMAT, WORKER_FILE_FORMAT))


def save_worker_states(path, states):
    """Puts one worker's `states` (with its "rank" and "num_workers") into `path`, keeping
    the entries other workers of the same job shape wrote there."""
    with _folder_locked(path):
        try:
            entries = _entries(path)
        except (ValueError, pickle.UnpicklingError, EOFError):
            entries = {}   # not ours, or cut short: replaced whole
        entries = {rank: saved for rank, saved in entries.items()
                   if saved.get("num_workers") == states["num_workers"]}
        entries[states["rank"]] = states
        write_atomically(path, {"format": WORKER_FILE_FORMAT, "workers": entries})


def load_worker_states(path, rank):
    """Worker `rank`'s states from `path`; where the file holds only other workers' states
    (a file per rank, loaded by another rank), the lowest rank's, with a warning."""
    entries = _entries(path)
    if not entries:
        raise ValueError("%s holds no dist_odsgd worker states" % path)
    if rank in entries:
        return entries[rank]
    other = min(entries)
    LOG.warning("odsgd: worker %d loads the states that worker %d saved (%s)", rank, other,
                path)
    return entries[other]
