"""What the training scripts save after epochs, and resume from (their checkpoints; the
store's own exact resume is odsgd/checkpoint.py).

Imperative mode: PREFIX-EEEE.params (`net.save_parameters`, the global weights), from rank 0.
Symbolic mode: MXNet's PREFIX-symbol.json and PREFIX-EEEE.params (`Module.save_checkpoint`),
from rank 0. Where the store can save its states (store.can_save_states: local stores and
dist_odsgd), every worker also saves its own: PREFIX-EEEE.states (rank 0, which with
dist_odsgd also has the servers write theirs beside it, .states.server<k>) and
PREFIX-EEEE.worker<r>.states (rank r > 0). dist_odsgd's local states differ between workers,
and the store expects every worker to save after the same step.

EEEE is the number of epochs done (1 after the first epoch), so a run resumes with
`--resume-params PREFIX-EEEE.params --resume-states PREFIX-EEEE.states --resume-epoch EEEE`;
each worker then loads its own states file.
"""
import logging
import os

LOG = logging.getLogger("odsgd.training")


def prefix(save_dir, task, model):
    return os.path.join(save_dir, "%s-%s" % (task, model))


def due(epochs_done, num_epochs, save_frequency):
    """True after the last epoch and every `save_frequency` epochs (0: last only)."""
    return epochs_done == num_epochs or (save_frequency > 0 and epochs_done % save_frequency == 0)


def states_path(path_prefix, epochs_done, rank):
    """Worker `rank`'s states file of the checkpoint after `epochs_done` epochs."""
    if rank == 0:
        return "%s-%04d.states" % (path_prefix, epochs_done)
    return "%s-%04d.worker%d.states" % (path_prefix, epochs_done, rank)


def resume_states_path(path, rank):
    """The states file that worker `rank` resumes from, given rank 0's (--resume-states):
    its own (PREFIX-EEEE.worker<r>.states) where it exists, else rank 0's."""
    if rank == 0 or not path.endswith(".states"):
        return path
    own = "%s.worker%d.states" % (path[:-len(".states")], rank)
    return own if os.path.exists(own) else path


def save_imperative(net, trainer, path_prefix, epochs_done, rank, states):
    """Rank 0 writes PREFIX-EEEE.params; with `states` every worker writes its states file.
    Returns the paths this worker wrote."""
    os.makedirs(os.path.dirname(os.path.abspath(path_prefix)), exist_ok=True)
    written = []
    if rank == 0:
        written.append("%s-%04d.params" % (path_prefix, epochs_done))
        net.save_parameters(written[-1])
    if states:
        written.append(states_path(path_prefix, epochs_done, rank))
        trainer.save_states(written[-1])
    LOG.info("saved %s", ", ".join(written))
    return written


def load_trainer_states(trainer, path, rank):
    """trainer.load_states of worker `rank`'s file (see resume_states_path), logged. For
    dist_odsgd the store also has the servers load the states saved beside rank 0's file."""
    path = resume_states_path(path, rank)
    trainer.load_states(path)
    LOG.info("resumed trainer states from %s", path)
