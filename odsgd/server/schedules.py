"""The learning-rate schedules that the parameter servers can unpickle: GluonCV's
`LRSequential` (linear warm-up, then step, cosine, poly, linear or constant decay) as
`ServerSafeSchedule`, and `server_safe(scheduler)`, which the store (odsgd/worker/kvstore.py) applies
to the optimizer it sends to the servers.

The servers run the global optimizer, schedule included, and receive it pickled. They unpickle
it while `import mxnet` is still running (MXNet starts the server loop inside that import),
and `import gluoncv` fails there ("missing mxnet"); the job then hangs. `ServerSafeSchedule`
therefore pickles as the arguments of its GluonCV schedulers, and is rebuilt from GluonCV's own
`gluoncv/utils/lr_scheduler.py`, loaded by path without running `gluoncv/__init__.py`; that file
needs only `mxnet.lr_scheduler`, which is ready by then. So the servers run GluonCV's code.
`server_safe(scheduler)` turns GluonCV's own LRSequential / LRScheduler objects (as GluonCV's
train_imagenet.py builds them) into ServerSafeSchedules with the same rates.

This module sits on the store's floor, below odsgd.training (whose schedule.py builds the
training scripts' schedules from it and re-exports it): it imports nothing of odsgd, so the
store does not import the training scripts' package, and a server unpickling a schedule
imports only this module.
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


def _rebuild(phases, offset, base_lr=None, base_lr_sets_rate=False):
    return ServerSafeSchedule(phases, offset, base_lr, base_lr_sets_rate)


class ServerSafeSchedule(_mx_lr_scheduler.LRScheduler):
    """GluonCV's `LRSequential` of `LRScheduler(**phase)` for each dict in `phases`.

    Parameters
    ----------
    phases : list of dict
        Keyword arguments of `gluoncv.utils.LRScheduler`, one per phase, in order.
    offset : int
        Updates already done before this run (resuming at an epoch): update u of this run
        reads the schedule at u + offset. (Negative: the schedule starts -offset updates late,
        as a lone GluonCV `LRScheduler(offset=-offset)` does.)
    base_lr : float, optional
        The `base_lr` attribute, which MXNet's Optimizer compares with its learning_rate and
        sets to it. Default: 0.01 (MXNet's), or the phase's base_lr with base_lr_sets_rate.
    base_lr_sets_rate : bool
        False (as GluonCV's LRSequential): setting `base_lr` leaves the rates as they are.
        True (as a lone GluonCV LRScheduler; needs exactly one phase): setting `base_lr` sets
        the phase's base_lr, so the rates follow it, except in 'constant' mode, whose rate is
        fixed when the phase is built (GluonCV's target_lr).
    """

    def __init__(self, phases, offset=0, base_lr=None, base_lr_sets_rate=False):
        self._base_lr_sets_rate = False
        super(ServerSafeSchedule, self).__init__()
        self.phases = [dict(phase) for phase in phases]
        self.offset = int(offset)
        gluoncv_schedules = gluoncv_lr_scheduler_module()
        self.schedule = gluoncv_schedules.LRSequential(
            [gluoncv_schedules.LRScheduler(**phase) for phase in self.phases])
        if base_lr_sets_rate and len(self.phases) != 1:
            raise ValueError("base_lr_sets_rate needs exactly one phase, got %d"
                             % len(self.phases))
        self._base_lr_sets_rate = bool(base_lr_sets_rate)
        if base_lr is None:
            # MXNet's default; a lone LRScheduler's is its phase's (GluonCV's default 0.1).
            base_lr = self.phases[0].get("base_lr", 0.1) if base_lr_sets_rate else 0.01
        self.base_lr = base_lr

    @property
    def base_lr(self):
        return self._base_lr

    @base_lr.setter
    def base_lr(self, value):
        self._base_lr = value
        if self._base_lr_sets_rate and self.phases[0]["mode"] != "constant":
            self.phases[0]["base_lr"] = value
            self.schedule.schedulers[0].base_lr = value

    @property
    def learning_rate(self):
        """The rate of the last call (as GluonCV's schedulers keep it)."""
        return self.schedule.learning_rate

    def __call__(self, num_update):
        return self.schedule(num_update + self.offset)

    def __reduce__(self):
        return (_rebuild, (self.phases, self.offset, self.base_lr, self._base_lr_sets_rate))


_GLUONCV_MODULES = ("gluoncv.utils.lr_scheduler", _PRIVATE_NAME)


def _is_gluoncv(obj, name):
    """Whether obj's type is exactly GluonCV's `name` (not a subclass, which may compute
    differently), from gluoncv itself or from the copy loaded by path."""
    return type(obj).__name__ == name and type(obj).__module__ in _GLUONCV_MODULES


def _from_gluoncv(obj):
    return any(cls.__module__.split(".")[0] in ("gluoncv", _PRIVATE_NAME)
               for cls in type(obj).__mro__)


def _untranslatable(obj, why):
    return ValueError(
        "the lr_scheduler %s.%s cannot be sent to the parameter servers (they cannot import "
        "gluoncv) and cannot be translated: %s. Use gluoncv.utils.LRSequential of "
        "gluoncv.utils.LRScheduler objects (translated to the same rates), "
        "odsgd.training.schedule.build_schedule / ServerSafeSchedule, or an "
        "mxnet.lr_scheduler scheduler" % (type(obj).__module__, type(obj).__qualname__, why))


def _phase(scheduler, owner):
    """The ServerSafeSchedule phase that computes what GluonCV's LRScheduler `scheduler`
    computes (its offset aside), from its attributes as they are now."""
    if not _is_gluoncv(scheduler, "LRScheduler"):
        raise _untranslatable(owner, "it holds a %s, not gluoncv.utils.LRScheduler"
                              % type(scheduler).__qualname__)
    mode = scheduler.mode
    if mode not in MODES:
        raise _untranslatable(owner, "unknown mode %r" % (mode,))
    # The constructor sets a constant phase's target_lr to its base_lr; GluonCV's rate in
    # constant mode is target_lr (base_lr, when set later, is not read).
    phase = dict(mode=mode, base_lr=scheduler.target_lr if mode == "constant"
                 else scheduler.base_lr, target_lr=scheduler.target_lr,
                 niters=scheduler.niters, power=scheduler.power,
                 step_factor=scheduler.step_factor)
    if mode == "step":
        # In iterations already; None (no decay) reads as no step.
        phase["step_iter"] = list(scheduler.step) if scheduler.step is not None else []
    return phase


def server_safe(scheduler):
    """An lr scheduler that the parameter servers can unpickle and that gives the same rate as
    `scheduler` at every update count.

    scheduler                                    returned
    -------------------------------------------  ------------------------------------------
    None                                         None
    ServerSafeSchedule (or a subclass)           scheduler itself
    an mxnet.lr_scheduler scheduler              scheduler itself
    gluoncv.utils.LRSequential of LRScheduler    a new ServerSafeSchedule of its phases;
                                                 `base_lr` copied, setting it changes no rate
                                                 (as for LRSequential)
    gluoncv.utils.LRScheduler (alone)            a new ServerSafeSchedule of one phase;
                                                 `base_lr` copied, and setting it sets the
                                                 rates as on GluonCV's LRScheduler (MXNet's
                                                 Optimizer sets it to its learning_rate)
    anything else of the gluoncv package (a      ValueError naming what to use
    subclass, a changed LRSequential, ...)
    anything else                                scheduler itself (not checked: it must
                                                 unpickle on a server without gluoncv)

    The translation reads the attributes as they are at the call (base_lr, target_lr, niters,
    step, step_factor, power, offset, mode): GluonCV's schedulers keep no state that changes
    their rates (`learning_rate` is only the last call's result), so later calls to the
    original do not matter, but later changes of its attributes are not followed. `scheduler`
    is never changed. The values are the same floats: the servers run GluonCV's own code
    (see ServerSafeSchedule).
    """
    if scheduler is None or isinstance(scheduler, ServerSafeSchedule):
        return scheduler
    if _is_gluoncv(scheduler, "LRSequential"):
        count, seps = 0, []
        for sub in scheduler.schedulers:
            _phase(sub, scheduler)
            if sub.offset != count:
                raise _untranslatable(scheduler, "its schedulers' offsets were changed after "
                                      "LRSequential set them")
            count += sub.niters
            seps.append(count)
        if scheduler.count != count or list(scheduler.update_sep) != seps:
            raise _untranslatable(scheduler, "its count/update_sep were changed")
        return ServerSafeSchedule([_phase(sub, scheduler) for sub in scheduler.schedulers],
                                  0, base_lr=scheduler.base_lr)
    if _is_gluoncv(scheduler, "LRScheduler"):
        phase = _phase(scheduler, scheduler)
        offset = scheduler.offset
        if offset != int(offset):
            raise _untranslatable(scheduler, "its offset %r is not a whole number" % (offset,))
        return ServerSafeSchedule([phase], -int(offset), base_lr=scheduler.base_lr,
                                  base_lr_sets_rate=True)
    if _from_gluoncv(scheduler):
        raise _untranslatable(scheduler, "only GluonCV's LRSequential and LRScheduler "
                              "themselves are translated")
    return scheduler


# Pickles (states files, the optimizer sent to the servers) name _rebuild by the module they
# have always named: odsgd.server_schedules, kept as an alias of this module.
_rebuild.__module__ = "odsgd.server_schedules"
