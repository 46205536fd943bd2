"""A worker's OD-SGD states, as `DistODSGD.save_optimizer_states` saves them and
`load_optimizer_states` restores them: per key its step count and its last two global weights
W_t and W_{t-1}, the local states (momentum, NAG estimate, adaptive variance, an mx.optimizer
local optimizer's states), the global step and the global optimizer's update count.

The file itself (one entry per worker rank, atomic writes) is odsgd/state_files.py; the
servers' states are written by the servers themselves beside it, `fname + '.server<k>'`
(server_updater.py), which the store asks them for.
"""
import os

from . import state_files
from .environment import num_servers


def server_pattern(fname):
    """The servers' states files of the worker states file `fname`: one %d, the server rank."""
    return fname.replace("%", "%%") + ".server%d"


def collect(store, dump_optimizer):
    """The states of this worker (a dict for state_files.save_worker_states). `store`: the
    DistODSGD (its planner, LocalUpdater, config, rank, global step and global optimizer).
    Every step it pushed must be applied first (mx.nd.waitall)."""
    optimizer, local = store.global_optimizer, store.local
    steps, global_weights = {}, {}
    for key, group in store.planner.groups.items():
        i = group.position(key)
        steps[key] = group.global_step
        global_weights[key] = (group.views(group.current)[i].asnumpy(),
                               group.views(group.previous)[i].asnumpy())
    saved = {"format": state_files.WORKER_STATES_FORMAT, "config": store.config.as_dict(),
             "rank": store.rank, "num_workers": store.num_workers,
             "num_servers": num_servers(),
             "steps": steps, "global_step": store.global_step,
             "global_weights": global_weights,
             "local": local.get_states(store.planner.holding_groups()) if local else None,
             "num_update": optimizer.num_update if optimizer is not None else None,
             "server_states": store.rank == 0 and optimizer is not None}
    if dump_optimizer:
        saved["optimizer"] = optimizer
    return saved


def read(fname, rank, planner):
    """This worker's states from `fname`, checked against the job and the store's keys
    (ValueError naming the fix), before anything is changed."""
    saved = state_files.load_worker_states(fname, rank)
    if saved.get("format") != state_files.WORKER_STATES_FORMAT:
        raise ValueError("%s holds dist_odsgd states of format %r; this version reads "
                         "format %d (save the checkpoint again with this version)"
                         % (fname, saved.get("format"), state_files.WORKER_STATES_FORMAT))
    if saved.get("server_states") and saved.get("num_servers") != num_servers():
        raise ValueError("%s was saved by a job with %s servers, this job has %d: start it "
                         "with -s %s (each server holds its own part of the states)"
                         % (fname, saved.get("num_servers"), num_servers(),
                            saved.get("num_servers")))
    for key, (current, _previous) in saved["global_weights"].items():
        if key not in planner.groups:
            raise ValueError("saved states have key %r, which this store has not "
                             "initialised" % (key,))
        group = planner.groups[key]
        if group.shapes[group.position(key)] != current.shape:
            raise ValueError("saved states of key %r have shape %s, the parameter has %s"
                             % (key, current.shape, group.shapes[group.position(key)]))
    return saved


def restore(saved, store):
    """Puts what `read` returned into the DistODSGD `store`: its key groups (W_t, W_{t-1},
    step counts), global step, LocalUpdater and the global optimizer's update count."""
    planner, local, optimizer = store.planner, store.local, store.global_optimizer
    for key, (current, previous) in saved["global_weights"].items():
        group = planner.groups[key]
        i = group.position(key)
        group.views(group.current)[i][:] = current
        group.views(group.previous)[i][:] = previous
        group.first_step, group.step = 0, saved["steps"][key]
    store.global_step = saved["global_step"]
    if saved.get("local") is not None:
        if local is None:
            raise ValueError("call set_optimizer before load_optimizer_states")
        local.set_states(saved["local"], planner.holding_groups())
    if saved.get("num_update") is not None and optimizer is not None:
        optimizer.num_update = saved["num_update"]


def check_server_files(fname):
    """ValueError when a server's states file beside `fname` is missing; returns their
    pattern (server_pattern)."""
    pattern = server_pattern(fname)
    missing = [pattern % k for k in range(num_servers()) if not os.path.exists(pattern % k)]
    if missing:
        raise ValueError("the servers' states %s are missing (written beside %s by "
                         "rank 0's save_optimizer_states)" % (", ".join(missing), fname))
    return pattern
