"""What the training scripts save after epochs, and resume from with --resume-params,
--resume-states and --resume-epoch (and, in symbolic mode, --resume auto).

Imperative mode: PREFIX-EEEE.params (the global weights, from rank 0: the model a user loads)
and a whole checkpoint of every worker and the servers (odsgd/training/checkpoints.py), which
--resume auto resumes exactly. A dist_odsgd checkpoint's PREFIX-stepNNNNNNNNN-worker0.states
also serves as --resume-states (each worker then loads its own -worker<r>.states).

Symbolic mode (Module.fit): MXNet's PREFIX-symbol.json and PREFIX-EEEE.params
(`Module.save_checkpoint`'s format, the global weights), from rank 0. Where the store can save
its states (store.can_save_states: local stores and dist_odsgd), every worker also saves its
own: PREFIX-EEEE.states (rank 0, which with dist_odsgd also has the servers write theirs beside
it, PREFIX-EEEE.states.servers) and PREFIX-EEEE.worker<r>.states (rank r > 0). Once every
worker has saved, rank 0 writes PREFIX-EEEE.saved.json, which names the files: --resume auto
resumes from the newest epoch that has one (an epoch boundary, every worker from the global
weights).

EEEE is the number of epochs done (1 after the first epoch), so a run resumes with
`--resume-params PREFIX-EEEE.params --resume-states PREFIX-EEEE.states --resume-epoch EEEE`;
each worker then loads its own states file.
"""
import glob
import json
import logging
import os
import re

LOG = logging.getLogger("odsgd.training")

#: the end of a symbolic epoch save's marker: PREFIX-EEEE.saved.json
EPOCH_MARKER_SUFFIX = ".saved.json"


def prefix(save_dir, task, model):
    return os.path.join(save_dir, "%s-%s" % (task, model))


def due(epochs_done, num_epochs, save_frequency):
    """True after the last epoch and every `save_frequency` epochs (0: last only)."""
    return epochs_done == num_epochs or (save_frequency > 0 and epochs_done % save_frequency == 0)


def params_path(path_prefix, epochs_done):
    """The global weights saved after `epochs_done` epochs: PREFIX-EEEE.params."""
    return "%s-%04d.params" % (path_prefix, epochs_done)


def states_path(path_prefix, epochs_done, rank):
    """Worker `rank`'s states file of the symbolic epoch save after `epochs_done` epochs."""
    if rank == 0:
        return "%s-%04d.states" % (path_prefix, epochs_done)
    return "%s-%04d.worker%d.states" % (path_prefix, epochs_done, rank)


def resume_states_path(path, rank):
    """The states file that worker `rank` resumes from, given rank 0's (--resume-states):
    its own where it exists (PREFIX-EEEE.worker<r>.states of an epoch save,
    <checkpoint>-worker<r>.states of a whole checkpoint), else rank 0's."""
    if rank == 0 or not path.endswith(".states"):
        return path
    if path.endswith("-worker0.states"):
        own = "%s-worker%d.states" % (path[:-len("-worker0.states")], rank)
    else:
        own = "%s.worker%d.states" % (path[:-len(".states")], rank)
    return own if os.path.exists(own) else path


def load_trainer_states(trainer, path, rank):
    """trainer.load_states of worker `rank`'s file (see resume_states_path), logged. For
    dist_odsgd the store also has the servers load the states saved beside rank 0's file."""
    path = resume_states_path(path, rank)
    trainer.load_states(path)
    LOG.info("resumed trainer states from %s", path)


# -- symbolic epoch saves: whole once rank 0 has written their marker ----------------------
def epoch_marker_path(path_prefix, epochs_done):
    return "%s-%04d%s" % (path_prefix, epochs_done, EPOCH_MARKER_SUFFIX)


def write_epoch_marker(path_prefix, epochs_done, files):
    """Rank 0, after every worker saved epoch `epochs_done`'s `files`: the marker naming them
    (through a temporary file renamed over it)."""
    path = epoch_marker_path(path_prefix, epochs_done)
    temporary = path + ".tmp"
    with open(temporary, "w") as f:
        json.dump({"epoch": epochs_done, "files": sorted(os.path.basename(p) for p in files)},
                  f, indent=1)
    os.replace(temporary, path)
    return path


def latest_epoch_save(path_prefix):
    """(epochs done, {'params': path, 'states': rank 0's path or ''}) of the newest symbolic
    epoch save of PREFIX whose marker exists and whose files are all there, or None."""
    pattern = re.compile(re.escape(os.path.basename(path_prefix)) + r"-(\d{4})" +
                         re.escape(EPOCH_MARKER_SUFFIX) + "$")
    found = []
    for marker in glob.glob(glob.escape(path_prefix) + "-*" + EPOCH_MARKER_SUFFIX):
        match = pattern.match(os.path.basename(marker))
        try:
            with open(marker) as f:
                files = json.load(f)["files"]
        except (OSError, ValueError, KeyError):
            continue
        folder = os.path.dirname(marker)
        if match and all(os.path.exists(os.path.join(folder, name)) for name in files):
            found.append((int(match.group(1)), files))
    if not found:
        return None
    epochs, files = max(found)
    states = states_path(path_prefix, epochs, 0)
    return epochs, {"params": params_path(path_prefix, epochs),
                    "states": states if os.path.basename(states) in files else ""}
