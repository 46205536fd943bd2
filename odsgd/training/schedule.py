"""Learning-rate schedules: GluonCV's `LRSequential` (linear warm-up, then step, cosine, poly,
linear or constant decay), in a form that the parameter servers can unpickle.

The servers run the global optimizer, schedule included, and receive it pickled. They unpickle
it while `import mxnet` is still running (MXNet starts the server loop inside that import),
and `import gluoncv` fails there ("missing mxnet"); the job then hangs. `ServerSafeSchedule`
therefore pickles as the arguments of its GluonCV schedulers, and is rebuilt from GluonCV's own
`gluoncv/utils/lr_scheduler.py`, loaded by path without running `gluoncv/__init__.py`; that file
needs only `mxnet.lr_scheduler`, which is ready by then. So the servers run GluonCV's code.

Counting: MXNet's optimizer calls the schedule with its update count, 1 for the first
update. With dist_sync and dist_odsgd the servers update each parameter once per global step,
so one epoch is `steps_per_epoch` updates. (With dist_async each worker's push is an update:
one epoch is `steps_per_epoch * num_workers` updates; `iterations_per_epoch` says so.)
"""
import importlib.machinery
import importlib.util
import os
import sys

from mxnet import lr_scheduler as _mx_lr_scheduler

MODES = ("step", "cosine", "poly", "linear", "constant")
_PRIVATE_NAME = "odsgd_gluoncv_lr_scheduler"


def gluoncv_lr_scheduler_module():
    """GluonCV's lr_scheduler module: the imported one when gluoncv is imported, else the same
    file loaded by path (without gluoncv/__init__.py, which cannot run on a server)."""
    module = sys.modules.get("gluoncv.utils.lr_scheduler") or sys.modules.get(_PRIVATE_NAME)
    if module is not None:
        return module
    # Finds the package on sys.path without importing it (nor asking sys.modules).
    spec = importlib.machinery.PathFinder.find_spec("gluoncv")
    if spec is None or spec.origin is None:
        raise ImportError("gluoncv is not installed: `pip install gluoncv` (see README, "
                          "with numpy==1.23.5)")
    path = os.path.join(os.path.dirname(spec.origin), "utils", "lr_scheduler.py")
    file_spec = importlib.util.spec_from_file_location(_PRIVATE_NAME, path)
    module = importlib.util.module_from_spec(file_spec)
    file_spec.loader.exec_module(module)
    sys.modules[_PRIVATE_NAME] = module
    return module


def _rebuild(phases, offset):
    return ServerSafeSchedule(phases, offset)


class ServerSafeSchedule(_mx_lr_scheduler.LRScheduler):
    """GluonCV's `LRSequential` of `LRScheduler(**phase)` for each dict in `phases`.

    Parameters
    ----------
    phases : list of dict
        Keyword arguments of `gluoncv.utils.LRScheduler`, one per phase, in order.
    offset : int
        Updates already done before this run (resuming at an epoch): update u of this run
        reads the schedule at u + offset.
    """

    def __init__(self, phases, offset=0):
        super(ServerSafeSchedule, self).__init__()
        self.phases = [dict(phase) for phase in phases]
        self.offset = int(offset)
        gluoncv_schedules = gluoncv_lr_scheduler_module()
        self.schedule = gluoncv_schedules.LRSequential(
            [gluoncv_schedules.LRScheduler(**phase) for phase in self.phases])

    def __call__(self, num_update):
        return self.schedule(num_update + self.offset)

    def __reduce__(self):
        return (_rebuild, (self.phases, self.offset))


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
