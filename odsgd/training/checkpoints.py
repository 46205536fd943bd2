"""Whole checkpoints of the training scripts, and --resume auto (imperative mode).

Every save is a whole `odsgd.save_checkpoint` (every worker's own weights and states, the
servers' states, then the marker) at `step_prefix(save_dir, "<task>-<model>", global step)`:
every --save-every-steps K global steps, and at the epoch ends --save-frequency asks for
(where rank 0 also writes PREFIX-EEEE.params, the global weights). The marker records `extra`
(`position_extra`): where the run stands (the epoch, the batches done in it, the global step),
what it must match to go on exactly (task, model, seed, workers, batch, steps per epoch), and
the history of the epochs done.

--resume auto loads the newest whole checkpoint of --save-dir (found once, before the
schedules are built, and loaded as `odsgd.resume_or_start` loads it) and training goes on at its epoch and batch. With the data and draws seeded by position
(odsgd/training/data.py) and nothing between steps changing a worker's weights (the epoch's
evaluation reads W into a copy: imperative.GlobalModel), the resumed run is the interrupted
one from there on: bit for bit with dist_odsgd, dist_sync and local stores (every worker's
w^i and W, tests/test_script_resume.py). dist_async's workers push in an
order set by timing, so its resumed run is a run from the same weights, states and step, not a
replay. The stores: dist_odsgd's own checkpoints (odsgd/worker/checkpoint.py), MXNet's dist_sync,
dist_async and local stores through odsgd/worker/mxnet_store_checkpoint.py, whose Trainer is prepared
before its first step (`prepare`, or resume_or_start).
"""
import collections
import logging
import os
import signal

import odsgd

from ..cluster import restarts
from ..common import checkpoint_index
from ..worker import checkpoint as worker_checkpoint
from . import epoch_saves

LOG = logging.getLogger("odsgd.training")

#: what a checkpoint's run must share with the run that resumes it to go on exactly
RUN_FIELDS = ("task", "model", "mode", "seed", "num_workers", "batch_per_worker",
              "steps_per_epoch")


class Position(collections.namedtuple("Position", "epoch batch history")):
    """Where training (re)starts: batch `batch` (0-based, the batches done) of epoch `epoch`,
    with the `history` entries of the epochs before it."""


def run_name(task, model):
    """The name of a run's checkpoints (step_prefix), as its epoch saves' PREFIX."""
    return "%s-%s" % (task, model)


def run_fields(run):
    """{field: value} of RUN_FIELDS for a session.Run."""
    args = run.args
    return {"task": run.task_name, "model": args.model, "mode": args.mode, "seed": args.seed,
            "num_workers": run.num_workers, "batch_per_worker": run.batch_per_worker,
            "steps_per_epoch": run.steps}


def position_extra(run, epoch, batch, history):
    """The `extra` of a checkpoint after `batch` batches of `epoch` (an epoch's last batch is
    recorded as batch 0 of the next): where to go on, what must match, the history so far,
    and the epochs the schedules were offset by (--resume-epoch of the run that began it)."""
    if batch == run.steps:
        epoch, batch = epoch + 1, 0
    return dict(run_fields(run), epoch=epoch, batch=batch,
                global_step=epoch * run.steps + batch, kvstore=run.args.kvstore,
                schedule_offset_epochs=run.schedule_offset_epochs, history=list(history))


def find_resume_point(args):
    """The newest whole checkpoint in --save-dir (a checkpoint_index.Checkpoint) when --resume
    auto is given, else None. Read before the schedules are built: their offset is the one the
    checkpoint's run began with."""
    if args.resume != "auto":
        return None
    return checkpoint_index.latest_checkpoint(args.save_dir)


def check_same_run(found, run):
    """ValueError naming the field where checkpoint `found` was saved by a run that this one
    cannot go on from exactly (another model, seed, number of workers, batch, data size)."""
    fields = run_fields(run)
    differ = ["%s %r (this run: %r)" % (name, found.extra.get(name), fields[name])
              for name in RUN_FIELDS if found.extra.get(name) != fields[name]]
    if differ:
        raise ValueError(
            "--resume auto: the newest whole checkpoint in %s, %s, was saved by another run: "
            "%s. Resume with that run's flags and data, or give another --save-dir to start "
            "a new run" % (run.args.save_dir, os.path.basename(found.prefix),
                           "; ".join(differ)))


def prepare(trainer):
    """Before the first step of a run that does not resume (--resume auto does this itself):
    a Trainer on one of MXNet's stores has its servers keep the optimizer's states where a
    checkpoint can save them (odsgd/worker/mxnet_store_checkpoint.py; the training is the same)."""
    odsgd.prepare_checkpoints(trainer)


def resume(run, trainer):
    """--resume auto: loads run.resume_point (every worker, before the first step) and returns
    the Position to go on from, or the start where --save-dir holds no whole checkpoint."""
    found, directory = run.resume_point, run.args.save_dir
    if found is not None:
        check_same_run(found, run)
    # the checkpoint found before the schedules were built, not the folder read again
    step = worker_checkpoint.resume_from(trainer, found)
    if found is None:
        LOG.info("--resume auto: no whole checkpoint in %s; training starts at step 0",
                 directory)
        return Position(0, 0, [])
    extra = found.extra
    LOG.info("--resume auto: resumed from %s (global step %d): epoch %d, batch %d of %d",
             found.prefix, step, extra["epoch"], extra["batch"], run.steps)
    if run.args.kvstore == "dist_async":
        LOG.warning("--resume auto with dist_async: the weights and states of the checkpoint "
                    "are loaded, but the workers' pushes interleave by timing, so the run "
                    "goes on as a new run from them, not as the interrupted one would have")
    return Position(extra["epoch"], extra["batch"], extra.get("history", []))


class Saves(object):
    """The whole checkpoints of one run (every worker calls the same methods after the same
    steps), --keep-checkpoints and --stop-after-steps. `history`: the run's history list
    (read at each save); `model`: rank 0's imperative.GlobalModel (None on other ranks)."""

    def __init__(self, run, trainer, history, model):
        self.run, self.trainer, self.history, self.model = run, trainer, history, model
        self.every = run.args.save_every_steps
        self.stop_step = run.args.stop_after_steps
        first_attempt = restarts.attempt_number() == 0
        self.fail_step = run.args.fail_after_steps if first_attempt and run.rank == 0 else 0

    def after_step(self, epoch, batches_done):
        """After a step that ends batch `batches_done` of `epoch` (train_epoch's after_step):
        saves where --save-every-steps says, before an epoch's end (at_epoch_end saves
        there); returns True when --stop-after-steps says to stop here."""
        if batches_done == self.run.steps:
            return False
        step = epoch * self.run.steps + batches_done
        if self.every and step % self.every == 0:
            self.save(epoch, batches_done)
        return self._stop_here(step)

    def at_epoch_end(self, epoch):
        """After `epoch` (its history entry appended): the epoch save where --save-frequency
        or --save-every-steps asks for one; returns True when --stop-after-steps says to stop
        here."""
        args, step = self.run.args, (epoch + 1) * self.run.steps
        if epoch_saves.due(epoch + 1, args.num_epochs, args.save_frequency):
            if self.model is not None:
                self.model.save(epoch_saves.params_path(self.run.prefix, epoch + 1))
            self.save(epoch, self.run.steps)
        elif self.every and step % self.every == 0:
            self.save(epoch, self.run.steps)
        return self._stop_here(step)

    def _stop_here(self, step):
        if self.fail_step and step == self.fail_step:
            LOG.error("--fail-after-steps: worker 0 kills itself after global step %d (a "
                      "drill of a failure)", step)
            logging.shutdown()                       # the log's last lines reach the file
            os.kill(os.getpid(), signal.SIGKILL)
        # == and not >=: a run resumed past the step goes on to the end
        if self.stop_step and step == self.stop_step:
            LOG.info("stopped after global step %d (--stop-after-steps)", step)
            return True
        return False

    def save(self, epoch, batches_done):
        """A whole checkpoint after `batches_done` batches of `epoch` (every worker)."""
        extra = position_extra(self.run, epoch, batches_done, self.history)
        prefix = checkpoint_index.step_prefix(
            self.run.args.save_dir, run_name(self.run.task_name, self.run.args.model),
            extra["global_step"])
        os.makedirs(self.run.args.save_dir, exist_ok=True)
        odsgd.save_checkpoint(self.trainer, prefix, extra=extra)
        if self.run.rank == 0:
            LOG.info("saved checkpoint %s (epoch %d, batch %d)", prefix, extra["epoch"],
                     extra["batch"])
            if self.run.args.keep_checkpoints:
                removed = checkpoint_index.prune_checkpoints(
                    self.run.args.save_dir, self.run.args.keep_checkpoints,
                    run_name(self.run.task_name, self.run.args.model))
                if removed:
                    LOG.info("removed older checkpoints %s (--keep-checkpoints %d)",
                             ", ".join(os.path.basename(p) for p in removed),
                             self.run.args.keep_checkpoints)
        return prefix
