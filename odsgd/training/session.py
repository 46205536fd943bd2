"""One training run of a task (ImageNet, CIFAR-10, MNIST): the flags in, the history out.

A script defines its `Task` (data, network) and calls `train(task, args)`; the order of what
happens here is what matters:

1. the number of workers, from the launcher's DMLC_NUM_WORKER, gives the equal steps per epoch
   and with them the schedules (the local one goes into the store's constructor);
2. the store, which knows this worker's rank; then logging (rank 0 only);
3. this worker's shard of the data, the network with the seed's weights (or --resume-params);
4. the imperative or symbolic loop (which, with --resume auto, loads the newest whole
   checkpoint of --save-dir first: odsgd/training/checkpoints.py); rank 0 writes --json.

--resume auto's checkpoint is looked up first of all: the schedules take the offset of the run
that saved it, and in symbolic mode it sets --resume-params, --resume-states, --resume-epoch.
"""
import atexit
import json
import logging
import os

import mxnet as mx

from ..cluster import restarts

from . import (checkpoints, data, epoch_saves, imperative, logs, networks, options, schedule,
               store, symbolic)

LOG = logging.getLogger("odsgd.training")


class Task(object):
    """What differs between the scripts.

    name : str                       'imagenet', 'cifar10', 'mnist' (file names, log lines)
    num_classes(args) -> int
    training_size(args) -> int       training samples in all shards together
    make_iterators(args, rank, num_workers, batch_size, with_val) -> (train_iter, val_iter)
    make_net(args) -> HybridBlock     uninitialised
    initializer(args) -> mx.init.Initializer
    """

    def __init__(self, name, num_classes, training_size, make_iterators, make_net,
                 initializer):
        self.name = name
        self.num_classes = num_classes
        self.training_size = training_size
        self.make_iterators = make_iterators
        self.make_net = make_net
        self.initializer = initializer


class Run(object):
    """Everything one run's loop needs (attributes set by `train`)."""

    def __init__(self, **fields):
        self.__dict__.update(fields)

    def lr_at(self, steps_done):
        """The global learning rate after `steps_done` steps of the run since its epoch 0 (for
        the logs): the schedule at the servers' update count then (the schedule adds its
        offset to the count)."""
        return self.schedule(max(1, self.iterations(steps_done)))


def schedule_offset_epochs(args, found=None):
    """The epochs the schedules are offset by: those of the run whose checkpoint `found`
    --resume auto goes on from; else --resume-epoch where the run starts without states
    (the servers' update count starts at 0 again: dist_sync, dist_async); else 0: the states
    loaded carry the update count (dist_odsgd's) or the whole optimizer with its own schedule
    (local stores), and an offset would count the epochs done twice."""
    if found is not None:
        return found.extra.get("schedule_offset_epochs", 0)
    return 0 if args.resume_states else args.resume_epoch


def make_schedules(args, steps, num_workers, offset_epochs=0):
    """(global schedule, local schedule or None), offset by `offset_epochs` (--resume-epoch,
    or that of the run whose checkpoint --resume auto goes on from)."""
    iters = schedule.iterations_per_epoch(steps, num_workers, args.kvstore)
    global_schedule = schedule.build_schedule(
        args.lr, args.lr_mode, args.num_epochs, iters, warmup_epochs=args.warmup_epochs,
        warmup_lr=args.warmup_lr, lr_decay=args.lr_decay,
        lr_decay_epoch=schedule.parse_epochs(args.lr_decay_epoch),
        offset=offset_epochs * iters)
    local_schedule = schedule.build_local_schedule(
        args.local_lr, schedule.parse_epochs(args.local_lr_decay_epoch), args.lr_decay, steps,
        offset=offset_epochs * steps)
    return global_schedule, local_schedule


def build_net(task, args, ctx_list, data_shape):
    """The task's network with --seed's initial weights, or --resume-params. In symbolic
    mode only its Symbol is used, and Module draws the initial weights (symbolic.fit)."""
    net = task.make_net(args)
    if args.mode == "symbolic":
        return net
    networks.initialize(net, task.initializer(args), args.seed, ctx_list, args.dtype)
    networks.finish_initialization(net, data_shape, ctx_list, args.dtype)
    if args.resume_params:
        net.load_parameters(args.resume_params, ctx=ctx_list, cast_dtype=True)
        LOG.info("resumed parameters from %s (epoch %d)", args.resume_params, args.resume_epoch)
    return net


def resume_point(task, args):
    """--resume auto's checkpoint, looked up before anything is built: imperative mode, the
    newest whole checkpoint of --save-dir (checkpoints.find_resume_point), or None; symbolic
    mode, the newest whole epoch save, set as --resume-params, --resume-states and
    --resume-epoch (None returned). Logs a launcher restart that does not resume."""
    attempt = restarts.attempt_number()
    if attempt and args.resume != "auto":
        LOG.warning("restart %d of the launcher without --resume auto: training starts over",
                    attempt)
    if args.resume != "auto" or args.mode != "symbolic":
        return checkpoints.find_resume_point(args)
    found = epoch_saves.latest_epoch_save(epoch_saves.prefix(args.save_dir, task.name,
                                                             args.model))
    if found is not None:
        args.resume_epoch, paths = found
        args.resume_params, args.resume_states = paths["params"], paths["states"]
    return None


def log_start(task, args, kv, ctx_list, sizes):
    """The run's first log lines: flags, store, data sizes (total, workers, batch, steps),
    and in symbolic mode where --resume auto starts."""
    LOG.info("%s: %s", task.name, vars(args))
    LOG.info("%s; contexts %s", store.describe(kv), ctx_list)
    LOG.info("%d training samples, %d workers, %d per worker and step: %d steps per epoch on "
             "every worker (the smallest shard's full batches)", *sizes)
    if args.resume == "auto" and args.mode == "symbolic":
        LOG.info("--resume auto (symbolic: at epoch boundaries): %s", "epoch %d's save in %s"
                 % (args.resume_epoch, args.save_dir) if args.resume_params else
                 "no whole epoch save in %s; training starts at epoch 0" % args.save_dir)


def finish_queued_work_at_exit():
    """Registers mx.nd.waitall() to run at interpreter exit after the store's own exit
    handlers and before MXNet's engine shutdown (atexit runs the newest first: MXNet's was
    registered at `import mxnet`, dist_odsgd registers its step check at the first step).

    Why: MXNet's engine shutdown skips work still queued, and dist_odsgd's exit check leaves
    pushes and pulls of its probe round queued when it returns; a worker whose pushes are
    skipped leaves the others waiting for them in ps-lite's finalize barrier forever."""
    atexit.register(mx.nd.waitall)


def train(task, args):
    """Runs the training of `task` with the parsed flags; returns the results dict (also
    written to --json by rank 0)."""
    options.check_arguments(args)
    finish_queued_work_at_exit()
    num_workers = store.cluster_size(args.kvstore)
    batch = args.batch_size * max(1, args.num_gpus)
    total = task.training_size(args)
    steps = data.steps_per_epoch(total, num_workers, batch)
    found = resume_point(task, args)
    offset_epochs = schedule_offset_epochs(args, found)
    global_schedule, local_schedule = make_schedules(args, steps, num_workers, offset_epochs)

    kv = store.create_store(args, local_schedule)
    rank = kv.rank
    if kv.num_workers != num_workers:
        raise ValueError("DMLC_NUM_WORKER=%d but the store has %d workers"
                         % (num_workers, kv.num_workers))
    ctx_list = imperative.contexts(
        args.num_gpus, rank * args.num_gpus if args.offset_gpus_by_rank else 0)
    log_file = logs.setup_logging(rank, args.logging_file or os.path.join(
        args.save_dir, "train_%s.log" % task.name))
    log_start(task, args, kv, ctx_list, (total, num_workers, batch, steps))

    train_iter, val_iter = task.make_iterators(args, rank, num_workers, batch, rank == 0)
    iters = schedule.iterations_per_epoch(steps, num_workers, args.kvstore)
    run = Run(args=args, kv=kv, rank=rank, num_workers=num_workers, contexts=ctx_list,
              batch_per_worker=batch, steps=steps, schedule=global_schedule,
              iterations=lambda s: s * iters // steps - offset_epochs * iters,
              train_iter=data.resized_to(train_iter, steps), val_iter=val_iter,
              net=build_net(task, args, ctx_list, train_iter.provide_data[0].shape),
              make_net=lambda: task.make_net(args),
              initializer=task.initializer(args),
              num_classes=task.num_classes(args), task_name=task.name,
              resume_point=found, schedule_offset_epochs=offset_epochs,
              prefix=epoch_saves.prefix(args.save_dir, task.name, args.model))
    history = (imperative.fit if args.mode == "imperative" else symbolic.fit)(run)
    results = {"task": task.name, "model": args.model, "mode": args.mode,
               "kvstore": args.kvstore, "workers": num_workers, "rank": rank,
               "steps_per_epoch": steps, "batch_per_worker": batch,
               "training_samples": total, "history": history, "log_file": log_file,
               "store": kv.config.as_dict() if hasattr(kv, "config") else None}
    if rank == 0 and args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return results
