"""Learning-rate schedules of the training scripts: GluonCV's train_imagenet.py schedule
(`build_schedule`: linear warm-up, then step, cosine, poly, linear or constant decay) and the
local optimizer's own step schedule, built as ServerSafeSchedules, which the parameter
servers can unpickle.

`ServerSafeSchedule`, `server_safe` and `gluoncv_lr_scheduler_module` live in
odsgd/server/schedules.py, below this package (the store, odsgd/worker/kvstore.py, imports
`server_safe` from there, not from here). They are imported here too, so
`odsgd.training.schedule.ServerSafeSchedule` and `schedule.server_safe` still work, and
schedules pickled before they moved (naming `odsgd.training.schedule._rebuild`) still load.

Counting: MXNet's optimizer calls the schedule with its update count, 1 for the first
update. With dist_sync and dist_odsgd the servers update each parameter once per global step,
so one epoch is `steps_per_epoch` updates. (With dist_async each worker's push is an update:
one epoch is `steps_per_epoch * num_workers` updates; `iterations_per_epoch` says so.)
"""
from ..server.schedules import (MODES, ServerSafeSchedule, _rebuild, gluoncv_lr_scheduler_module,  # noqa: F401
                                server_safe)


def parse_epochs(text):
    """'30,60,80' -> [30, 60, 80]; '' -> []."""
    return [int(part) for part in str(text).split(",") if part.strip()]


def iterations_per_epoch(steps_per_epoch, num_workers, kvstore):
    """Optimizer updates per epoch on the servers (see the module docstring)."""
    return steps_per_epoch * (num_workers if kvstore == "dist_async" else 1)


def build_schedule(lr, lr_mode, num_epochs, iters_per_epoch, warmup_epochs=0, warmup_lr=0.0,
                   lr_decay=0.1, lr_decay_epoch=(), target_lr=0.0, power=2.0, offset=0):
    """GluonCV's train_imagenet.py schedule: `warmup_epochs` of linear warm-up from
    `warmup_lr` to `lr`, then `lr_mode` down to `target_lr` (step mode: times `lr_decay` at
    each epoch of `lr_decay_epoch`, counted from the start of training) until `num_epochs`.

    Returns a ServerSafeSchedule, whose value at update u (1-based) is the rate."""
    if lr_mode not in MODES:
        raise ValueError("--lr-mode must be one of %s, got %r" % (", ".join(MODES), lr_mode))
    if iters_per_epoch < 1:
        raise ValueError("iters_per_epoch must be >= 1, got %r" % iters_per_epoch)
    if not 0 <= warmup_epochs < num_epochs:
        raise ValueError("--warmup-epochs (%r) must be >= 0 and less than --num-epochs (%r)"
                         % (warmup_epochs, num_epochs))
    decay_after_warmup = [e - warmup_epochs for e in lr_decay_epoch]
    phases = [dict(mode="linear", base_lr=warmup_lr, target_lr=lr, nepochs=warmup_epochs,
                   iters_per_epoch=iters_per_epoch),
              dict(mode=lr_mode, base_lr=lr, target_lr=target_lr,
                   nepochs=num_epochs - warmup_epochs, iters_per_epoch=iters_per_epoch,
                   step_epoch=decay_after_warmup, step_factor=lr_decay, power=power)]
    if warmup_epochs == 0:
        phases = phases[1:]
    result = ServerSafeSchedule(phases, offset)
    result.base_lr = lr   # what MXNet's Optimizer compares with its learning_rate
    return result


def build_local_schedule(local_lr, decay_epochs, lr_decay, steps_per_epoch, offset=0):
    """The local optimizer's own step schedule (dist_odsgd with local_optimizer='sgd'):
    `local_lr` times `lr_decay` at each epoch of `decay_epochs`. It runs on the workers only
    and counts global steps. None when there is nothing to decay."""
    if not decay_epochs:
        return None
    if local_lr is None:
        raise ValueError("--local-lr-decay-epoch needs --local-lr: without it the local rate "
                         "is derived from the global rate and already follows --lr-mode")
    phases = [dict(mode="step", base_lr=local_lr, nepochs=max(decay_epochs) + 1,
                   iters_per_epoch=steps_per_epoch, step_epoch=list(decay_epochs),
                   step_factor=lr_decay)]
    result = ServerSafeSchedule(phases, offset)
    result.base_lr = local_lr
    return result
