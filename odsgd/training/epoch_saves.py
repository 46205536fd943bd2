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
worker has saved, rank 0 writes the marker of a whole checkpoint, PREFIX-EEEE.whole.json
(odsgd/common/checkpoint_index.py), which names the files: --resume auto resumes from the
newest epoch that has one (an epoch boundary, every worker from the global weights), and
`odsgd.launch --max-restarts --checkpoint-dir` counts it as the progress of an attempt.

EEEE is the number of epochs done (1 after the first epoch), so a run resumes with
`--resume-params PREFIX-EEEE.params --resume-states PREFIX-EEEE.states --resume-epoch EEEE`;
each worker then loads its own states file.
"""
import logging
import os
import re

from ..common import checkpoint_index

LOG = logging.getLogger("odsgd.training")


def prefix(save_dir, task, model):
    return os.path.join(save_dir, "%s-%s" % (task, model))


def due(epochs_done, num_epochs, save_frequency):
    """True after the last epoch and every `save_frequency` epochs (0: last only)."""
    return epochs_done == num_epochs or (save_frequency > 0 and epochs_done % save_frequency == 0)


def epoch_prefix(path_prefix, epochs_done):
    """What the files of the save after `epochs_done` epochs begin with: PREFIX-EEEE."""
    return "%s-%04d" % (path_prefix, epochs_done)


def params_path(path_prefix, epochs_done):
    """The global weights saved after `epochs_done` epochs: PREFIX-EEEE.params."""
    return epoch_prefix(path_prefix, epochs_done) + ".params"


def states_path(path_prefix, epochs_done, rank):
    """Worker `rank`'s states file of the symbolic epoch save after `epochs_done` epochs."""
    if rank == 0:
        return epoch_prefix(path_prefix, epochs_done) + ".states"
    return "%s.worker%d.states" % (epoch_prefix(path_prefix, epochs_done), rank)


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
def begin_epoch_save(path_prefix, epochs_done):
    """Before the files of a symbolic epoch save are written: its marker goes first, so that
    a marker never stands beside the files of another save."""
    checkpoint_index.remove_marker(epoch_prefix(path_prefix, epochs_done))


def write_epoch_marker(path_prefix, epochs_done, files, step, store, num_workers):
    """Rank 0, after every worker saved epoch `epochs_done`'s `files` (`step` global steps
    done, by `num_workers` workers of kvstore `store`): the marker of a whole checkpoint."""
    states = states_path(path_prefix, epochs_done, 0)
    return checkpoint_index.write_marker(
        epoch_prefix(path_prefix, epochs_done), step, store, num_workers, files,
        extra={"mode": "symbolic", "epoch": epochs_done, "states": states in files})


def latest_epoch_save(path_prefix):
    """(epochs done, {'params': path, 'states': rank 0's path or ''}) of the newest symbolic
    epoch save of PREFIX whose marker exists and whose files are all there, or None."""
    name = re.compile(re.escape(os.path.basename(path_prefix)) + r"-\d{4}$")
    found = [c for c in checkpoint_index.whole_checkpoints(os.path.dirname(path_prefix) or ".")
             if c.extra.get("mode") == "symbolic" and name.match(os.path.basename(c.prefix))]
    if not found:
        return None
    epochs = found[-1].extra["epoch"]
    return epochs, {"params": params_path(path_prefix, epochs),
                    "states": states_path(path_prefix, epochs, 0)
                    if found[-1].extra["states"] else ""}
