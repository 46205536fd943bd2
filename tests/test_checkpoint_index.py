"""The index of whole checkpoints (odsgd/common/checkpoint_index.py): a checkpoint counts only
with its marker, written last; the newest whole one is found, pruned ones go marker first, and
all of it works where MXNet is not imported (the launcher reads the folder between attempts)."""
import os
import subprocess
import sys

import pytest

from cluster import REPO
from odsgd.common import checkpoint_index as index


def save(folder, step, whole=True, name="run", files=("worker0.params", "worker0.states")):
    """The files of a save after `step`, and its marker where `whole`."""
    prefix = index.step_prefix(str(folder), name, step)
    written = []
    for suffix in files:
        path = "%s-%s" % (prefix, suffix)
        with open(path, "w") as f:
            f.write("x")
        written.append(path)
    if whole:
        index.write_marker(prefix, step, "dist_odsgd", 1, written, {"epoch": step // 10})
    return prefix


def test_the_newest_whole_checkpoint_is_found(tmp_path):
    assert index.latest_checkpoint(str(tmp_path / "none")) is None
    save(tmp_path, 10)
    newest = save(tmp_path, 20)
    save(tmp_path, 30, whole=False)                        # cut short: no marker
    latest = index.latest_checkpoint(str(tmp_path))
    assert (latest.prefix, latest.step, latest.store, latest.num_workers, latest.extra) == \
        (newest, 20, "dist_odsgd", 1, {"epoch": 2})
    os.unlink(newest + "-worker0.states")                  # a file the marker names is gone
    assert index.latest_checkpoint(str(tmp_path)).step == 10


def test_a_save_removes_the_marker_first(tmp_path):
    prefix = save(tmp_path, 10)
    index.remove_marker(prefix)
    assert index.latest_checkpoint(str(tmp_path)) is None
    index.remove_marker(prefix)                            # nothing there: no error


def test_pruning_keeps_the_newest_and_removes_older_saves_cut_short(tmp_path):
    for step in (10, 20, 30, 40):
        save(tmp_path, step)
    save(tmp_path, 25, whole=False)                        # older than those kept
    save(tmp_path, 45, whole=False)                        # newer: may be a save under way
    other = save(tmp_path, 5, name="other")                # another run's: left alone
    removed = index.prune_checkpoints(str(tmp_path), 2, name="run")
    assert sorted(removed) == sorted(index.step_prefix(str(tmp_path), "run", s)
                                     for s in (10, 20, 25))
    assert [c.step for c in index.whole_checkpoints(str(tmp_path))] == [5, 30, 40]
    assert os.path.exists(index.step_prefix(str(tmp_path), "run", 45) + "-worker0.params")
    assert os.path.exists(index.marker_path(other))
    with pytest.raises(ValueError, match="keep must be >= 1"):
        index.prune_checkpoints(str(tmp_path), 0)


def test_the_launcher_reads_checkpoints_without_mxnet(tmp_path):
    """odsgd.latest_checkpoint in a process where any import of MXNet fails, as the launcher
    (which never imports it) calls it."""
    save(tmp_path, 20)
    code = ("import sys\nsys.modules['mxnet'] = None\nimport odsgd\n"
            "print(odsgd.latest_checkpoint(sys.argv[1]).step, odsgd.MXNET_INSTALLED)\n"
            "assert sys.modules['mxnet'] is None\n")
    run = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True,
                         text=True, timeout=60, env=dict(os.environ, PYTHONPATH=REPO))
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == ["20", "False"]
