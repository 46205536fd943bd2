"""Per-parameter rates and the schedule index, in one place, exactly as MXNet's servers apply
them, so that the local step (SPEC.md section 2) uses the rates the global update uses.

* `multipliers(optimizer, index)`: a parameter's (lr_mult, wd_mult), looked up by the index the
  servers pass to the optimizer, in MXNet 1.9's order (`Optimizer._get_lrs` / `_get_wds`):
  Gluon's `Parameter.lr_mult` / `wd_mult` (through `param_dict`), then multipliers set by
  index, then by name (`idx2name`; Module gives names not ending in `_weight` / `_gamma` a
  wd_mult of 0, and symbol attributes such as `mx.AttrScope(lr_mult=...)` land here).
  MXNet pickles the optimizer without `param_dict` (`Optimizer.__getstate__`), so with plain
  `dist_sync` Gluon's `Parameter.lr_mult` / `wd_mult` never reach the servers and are
  silently ignored there; dist_odsgd sends them as index multipliers (kvstore.py,
  `_sync_multipliers`), so the servers apply what the user set.
* `global_learning_rate(optimizer, step)`: the rate of global update `step`, counted as the
  servers count it (`begin_num_update` included).
"""


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
        return optimizer.lr_scheduler(schedule_count(optimizer, step))
    return optimizer.lr
