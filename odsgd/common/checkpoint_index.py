"""Whole checkpoints in a folder: the marker a save writes last, and the newest whole one.

A checkpoint is whole once every worker's files and the servers' states are written. The save
(`odsgd.save_checkpoint`) then writes one more file, its *marker* `<prefix>.whole.json`, from
rank 0 and after a barrier of every worker: a checkpoint without a marker was cut short (a
process killed, a link lost mid-save) and is never resumed from. Before it writes anything, a
save removes the marker of its prefix, so a marker never stands beside files of another save.

    odsgd.latest_checkpoint("ckpt")   # the newest whole checkpoint in ckpt/, or None

This module imports no MXNet: the launcher (`python -m odsgd.launch --checkpoint-dir`) reads
the folder with it, between the attempts of a job, without MXNet's seconds of import.
"""
import collections
import glob
import json
import logging
import os
import re
import tempfile

LOG = logging.getLogger("odsgd")

#: the file name of a marker: the checkpoint's prefix followed by this
MARKER_SUFFIX = ".whole.json"
#: version of the markers written here
MARKER_FORMAT = 1


class Checkpoint(collections.namedtuple(
        "Checkpoint", "prefix step store num_workers extra marker")):
    """A whole checkpoint: `prefix` (the path its files start with), `step` (global steps done
    when it was saved), `store` (the kvstore type that saved it: 'dist_odsgd', 'dist_sync',
    ...), `num_workers`, `extra` (the dict the saver gave, e.g. {'epoch': 3, 'batch': 120}) and
    `marker` (the marker's path)."""


def marker_path(prefix):
    """The marker file of the checkpoint at `prefix`."""
    return prefix + MARKER_SUFFIX


def remove_marker(prefix):
    """Removes the marker of `prefix` if there is one (a save to it begins)."""
    try:
        os.unlink(marker_path(prefix))
    except FileNotFoundError:
        pass


def write_marker(prefix, step, store, num_workers, files, extra=None):
    """Writes the marker of `prefix` (through a temporary file renamed over it): the last
    file of a save, after every worker's and the servers' `files` (names, relative to the
    prefix's folder, or paths) are written."""
    record = {"format": MARKER_FORMAT, "prefix": os.path.basename(prefix), "step": int(step),
              "store": str(store), "num_workers": int(num_workers),
              "files": sorted(os.path.basename(f) for f in files), "extra": dict(extra or {})}

    # Its own temporary file, not state_files.replace_atomically: this module imports nothing
    # of the package, so that a job testing the launcher alone loads it by its path.
    folder = os.path.dirname(os.path.abspath(prefix))
    handle, temporary = tempfile.mkstemp(dir=folder, prefix=os.path.basename(prefix) + ".",
                                         suffix=".tmp")
    try:
        with os.fdopen(handle, "w") as f:
            json.dump(record, f, indent=1, sort_keys=True)
        os.replace(temporary, marker_path(prefix))
    except BaseException:
        if os.path.exists(temporary):
            os.unlink(temporary)
        raise
    return marker_path(prefix)


def read_marker(path):
    """The Checkpoint a marker file describes, or None where it is not a marker of this
    format or a file it names is missing (a checkpoint pruned or moved by hand)."""
    try:
        with open(path) as f:
            record = json.load(f)
    except (OSError, ValueError):
        return None
    if not isinstance(record, dict) or record.get("format") != MARKER_FORMAT:
        return None
    folder = os.path.dirname(os.path.abspath(path))
    if not all(os.path.exists(os.path.join(folder, name)) for name in record["files"]):
        LOG.warning("odsgd: %s names files that are gone; not a whole checkpoint", path)
        return None
    prefix = path[:-len(MARKER_SUFFIX)]
    return Checkpoint(prefix, record["step"], record["store"], record["num_workers"],
                      record.get("extra", {}), path)


def whole_checkpoints(directory):
    """The whole checkpoints in `directory`, oldest first (by step, then by the marker's
    time); [] where the folder does not exist."""
    found = [read_marker(path) for path in
             glob.glob(os.path.join(glob.escape(directory), "*" + MARKER_SUFFIX))]
    found = [c for c in found if c is not None]
    return sorted(found, key=lambda c: (c.step, os.path.getmtime(c.marker), c.prefix))


def latest_checkpoint(directory):
    """The newest whole checkpoint in `directory` (a Checkpoint), or None."""
    found = whole_checkpoints(directory)
    return found[-1] if found else None


def step_prefix(directory, name, step):
    """The prefix of a checkpoint of run `name` after `step` global steps in `directory`,
    e.g. 'ckpt/mnist-mlp-step000000120': the training scripts' names, one per step."""
    return os.path.join(directory, "%s-step%09d" % (name, step))


#: a step_prefix name (then, in a file's name, what the file adds to it)
_STEP_NAME = re.compile(r"(?P<name>.+)-step(?P<step>\d{9})")


def checkpoint_files(prefix):
    """Every file of the checkpoint at `prefix`: its marker and the files whose names begin
    with `<prefix>-` or `<prefix>.` (the workers' and servers' files, temporaries of a save
    cut short)."""
    base = glob.escape(prefix)
    return sorted(set(glob.glob(base + "-*") + glob.glob(base + ".*")))


def prune_checkpoints(directory, keep, name=None):
    """Keeps the newest `keep` whole checkpoints in `directory` (of run `name` where given)
    and removes the older ones, marker first, so that a checkpoint is never left whole-looking
    with files missing. Saves that were cut short (no marker) and are older than the oldest
    one kept are removed too, where their names say their step (step_prefix). Returns the
    prefixes removed."""
    if keep < 1:
        raise ValueError("keep must be >= 1 (the newest whole checkpoint is never removed), "
                         "got %r" % (keep,))
    whole = [c for c in whole_checkpoints(directory)
             if name is None or _run_of(c.prefix) in (None, name)]
    if len(whole) <= keep:
        return []
    kept = whole[-keep:]
    removed = []
    for checkpoint in whole[:-keep]:
        remove_marker(checkpoint.prefix)
        _remove(checkpoint_files(checkpoint.prefix))
        removed.append(checkpoint.prefix)
    oldest_kept = min(c.step for c in kept)
    kept_prefixes = {c.prefix for c in kept}
    for prefix, step in _named_prefixes(directory, name):
        if step < oldest_kept and prefix not in kept_prefixes and \
                not os.path.exists(marker_path(prefix)):
            _remove(checkpoint_files(prefix))
            removed.append(prefix)
    return removed


def _run_of(prefix):
    match = _STEP_NAME.fullmatch(os.path.basename(prefix))
    return match.group("name") if match else None


def _named_prefixes(directory, name):
    """(prefix, step) of every step_prefix-named checkpoint in `directory`, whole or not."""
    seen = {}
    for path in glob.glob(os.path.join(glob.escape(directory), "*-step" + "[0-9]" * 9 + "*")):
        base = os.path.basename(path)
        match = _STEP_NAME.match(base)
        if match and (name is None or match.group("name") == name):
            prefix = os.path.join(directory, base[:match.end()])
            seen[prefix] = int(match.group("step"))
    return sorted(seen.items())


def _remove(paths):
    for path in paths:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
