"""Per-parameter rates and the schedule index, in one place, exactly as MXNet's servers apply
them, so that the local step (docs/spec.md, section 4) uses the rates the global update uses.

* `multipliers(optimizer, index)`: a parameter's (lr_mult, wd_mult), looked up by the index the
  servers pass to the optimizer, in MXNet 1.9's order (`Optimizer._get_lrs` / `_get_wds`):
  Gluon's `Parameter.lr_mult` / `wd_mult` (through `param_dict`), then multipliers set by
  index, then by name (`idx2name`; Module gives names not ending in `_weight` / `_gamma` a
  wd_mult of 0, and symbol attributes such as `mx.AttrScope(lr_mult=...)` land here).
  MXNet pickles the optimizer without `param_dict` (`Optimizer.__getstate__`), so with plain
  `dist_sync` Gluon's `Parameter.lr_mult` / `wd_mult` never reach the servers and are
  silently ignored there; dist_odsgd sends them as index multipliers
  (odsgd/worker/server_settings.py, `ServerSettings.send_multipliers`), so the servers apply what
  the user set.
* `global_learning_rate(optimizer, step)`: the rate of global update `step`, counted as the
  servers count it (`begin_num_update` included).
* `ScheduleAtAnyCount`: a schedule asked at counts in any order gives what it gives when asked
  in increasing order (the servers' rounds of different keys arrive in any order; the worker
  asks the rate of step t - 1 after that of step t).
"""
import copy
import weakref


def multipliers(optimizer, index):
    """(lr_mult, wd_mult) of the parameter the optimizer knows as `index`."""
    param = optimizer.param_dict.get(index)
    if param is not None:
        return float(param.lr_mult), float(param.wd_mult)
    name = optimizer.idx2name.get(index)
    lr_mult = optimizer.lr_mult.get(index, optimizer.lr_mult.get(name, 1.0)
                                    if name is not None else 1.0)
    wd_mult = optimizer.wd_mult.get(index, optimizer.wd_mult.get(name, 1.0)
                                    if name is not None else 1.0)
    return float(lr_mult), float(wd_mult)


def schedule_count(optimizer, step):
    """The update count the servers' optimizer reads its schedule at for global update `step`
    (0-based): MXNet counts an update before it reads the rate and starts the count at
    `begin_num_update`."""
    return optimizer.begin_num_update + step + 1


def global_learning_rate(optimizer, step):
    """The base learning rate (before multipliers) of global update `step` on the servers."""
    if optimizer.lr_scheduler is not None:
        return at_any_count(optimizer)(schedule_count(optimizer, step))
    return optimizer.lr


class ScheduleAtAnyCount(object):
    """`schedule` (an MXNet LRScheduler or any callable of the update count) asked at counts in
    any order. MXNet's FactorScheduler and MultiFactorScheduler keep state that only moves
    forward: asked at a count below one they have passed, they answer the later, decayed rate.
    A count at or above the highest asked so far goes to `schedule` itself (which moves on as
    it would in MXNet's own loop); a lower one to a fresh copy of the schedule as it was when
    wrapped, which computes that count from the start (these schedulers reach any count in one
    call). Answers are remembered for the last KEEP counts."""

    KEEP = 256

    def __init__(self, schedule):
        self.schedule = schedule
        self._initial = copy.deepcopy(schedule)
        self._highest = None
        self._rates = {}

    def __call__(self, count):
        rate = self._rates.get(count)
        if rate is not None:
            return rate
        if self._highest is None or count >= self._highest:
            rate = self.schedule(count)
            self._highest = count
        else:
            rate = copy.deepcopy(self._initial)(count)
        self._rates[count] = rate
        if len(self._rates) > 2 * self.KEEP:
            for old in sorted(self._rates)[:-self.KEEP]:
                del self._rates[old]
        return rate

    def __getattr__(self, name):
        # base_lr, warmup settings, ...: the wrapped schedule's
        if name in ("schedule", "_initial", "_highest", "_rates"):
            raise AttributeError(name)
        return getattr(self.schedule, name)


#: optimizer -> the ScheduleAtAnyCount of its lr_scheduler on this process. Keyed by the
#: optimizer, weakly: the wrapper holds the schedule, not the optimizer, so an entry goes with
#: its optimizer (a schedule as the key would be held by its own entry's value).
_WRAPPED = weakref.WeakKeyDictionary()


def at_any_count(optimizer):
    """The ScheduleAtAnyCount of `optimizer.lr_scheduler` on this process (made once per
    schedule object), or the schedule itself when it already is one."""
    schedule = optimizer.lr_scheduler
    if isinstance(schedule, ScheduleAtAnyCount):
        return schedule
    try:
        wrapped = _WRAPPED.get(optimizer)
        if wrapped is None or wrapped.schedule is not schedule:
            wrapped = _WRAPPED[optimizer] = ScheduleAtAnyCount(schedule)
    except TypeError:   # not weakly referable: ask it as it is
        return schedule
    return wrapped
