"""A worker's OD-SGD states, as `DistODSGD.save_optimizer_states` saves them and
`load_optimizer_states` restores them: per key its step count and its last two global weights
W_t and W_{t-1}, the local states (momentum, NAG estimate, adaptive variance, an mx.optimizer
local optimizer's states), the global step, the global optimizer's update count and
begin_num_update, and the key layout the job had (key_plan.layout_settings).

Nothing in them depends on that layout: every state is kept per parameter (the user's key),
whole, and the servers' states are joined per parameter too (odsgd/server/states.py), so a job
may resume with another part size, fusion size or number of servers.

The file itself (one entry per worker rank, atomic writes) is odsgd/common/state_files.py. The servers
write the states of the pieces they hold beside it, `fname + '.server<k>'`, which rank 0 joins
into `fname + '.servers'` (`join_server_files`).
"""
import os

import mxnet as mx

from ..server import states as server_states
from ..common import state_files
from ..server import updater as servers
from .environment import num_servers
from .key_plan import layout_settings


def save(store, fname, dump_optimizer):
    """DistODSGD.save_optimizer_states: this worker's states into `fname` (one entry per rank,
    odsgd/common/state_files.py: workers that save to one path, as GluonCV's scripts do, keep each
    other's entries; every write through a temporary file of its own) after everything it
    pushed is applied. On rank 0 also the servers' states, whole per parameter, into
    `servers_file(fname)`: each server writes the pieces it holds beside `fname` and rank 0
    joins them (odsgd/server/states.py), so a job of another layout can load them; the
    servers and rank 0 must share that folder. Right after a load, with no step since, the
    servers' states are the loaded file's, copied."""
    mx.nd.waitall()   # every step this worker pushed is applied; W_t has arrived
    saved = collect(store, dump_optimizer)
    state_files.save_worker_states(fname, saved)
    if saved["server_states"] and store.settings.loaded_states is not None:
        copy_server_file(store.settings.loaded_states[0], fname)
    elif saved["server_states"]:
        servers.send_command(store.raw, servers.save_states_command(
            server_pattern(fname), store.global_step))
        join_server_files(fname, saved["layout"])


def load(store, fname):
    """DistODSGD.load_optimizer_states: this worker's states from `fname`, checked (the
    workers compare their steps, collectively) and restored; on rank 0 the servers are to load
    theirs from `servers_file(fname)` before the next step's rounds, each the pieces it holds
    in the layout of that step (ServerSettings.load_states_later)."""
    saved = read(fname, store.rank, store.num_workers, store.planner, store.global_optimizer)
    store.agreement.check_same(
        [saved["global_step"]], lambda v: "%d" % v[0],
        lambda mine, theirs: "%s holds worker %d's states after step %s, but rank 0's states "
        "are after step %s: a save was cut short (or the files are of different "
        "checkpoints); load an earlier checkpoint" % (fname, store.rank, mine, theirs))
    restore(saved, store)
    if saved.get("server_states") and store.rank == 0:
        if store.global_optimizer is None:
            raise ValueError("call set_optimizer before load_optimizer_states")
        path = check_server_file(fname, saved["global_step"])
        store.settings.load_states_later(path, saved["global_step"])


def server_pattern(fname):
    """The servers' own states files of the worker states file `fname`: one %d, the server
    rank."""
    return fname.replace("%", "%%") + ".server%d"


def servers_file(fname):
    """The whole-parameter states of the servers, beside the worker states file `fname`."""
    return fname + ".servers"


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
             "num_servers": num_servers(), "layout": dict(layout_settings(store.config)),
             "begin_num_update": optimizer.begin_num_update if optimizer is not None else None,
             # the weights file of odsgd.save_checkpoint that these states go with
             "weights_file": getattr(store, "weights_file", None),
             "steps": steps, "global_step": store.global_step,
             "global_weights": global_weights,
             "local": local.get_states(store.planner.holding_groups()) if local else None,
             "num_update": optimizer.num_update if optimizer is not None else None,
             "server_states": store.rank == 0 and optimizer is not None}
    if dump_optimizer:
        saved["optimizer"] = optimizer
    return saved


def read(fname, rank, num_workers, planner, optimizer):
    """This worker's states from `fname`, checked against the job, the global optimizer and
    the store's keys (ValueError naming the fix), before anything is changed."""
    saved = state_files.load_worker_states(fname, rank)
    if saved.get("format") != state_files.WORKER_STATES_FORMAT:
        raise ValueError("%s holds dist_odsgd states of format %r; this version reads "
                         "format %d (save the checkpoint again with this version)"
                         % (fname, saved.get("format"), state_files.WORKER_STATES_FORMAT))
    check_num_workers(fname, saved, num_workers)
    check_begin_num_update(fname, saved, optimizer)
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
        group.global_step = saved["steps"][key]
    store.global_step = saved["global_step"]
    if saved.get("local") is not None:
        if local is None:
            raise ValueError("call set_optimizer before load_optimizer_states")
        local.set_states(saved["local"], planner.holding_groups())
    if saved.get("num_update") is not None and optimizer is not None:
        optimizer.num_update = saved["num_update"]


def check_num_workers(fname, saved, num_workers):
    """ValueError naming both counts when the states were saved by a job of another number of
    workers: the global optimizer's rescale_grad (1 / (batch x workers)) and each worker's
    own weights and local states belong to that number."""
    if saved.get("num_workers") not in (None, num_workers):
        raise ValueError(
            "%s was saved by a job of %d workers; this job has %d. A dist_odsgd checkpoint "
            "holds each worker's own weights and states and the gradient scale of its number "
            "of workers: resume it with %d workers (-n %d)"
            % (fname, saved["num_workers"], num_workers, saved["num_workers"],
               saved["num_workers"]))


def check_begin_num_update(fname, saved, optimizer):
    """ValueError when the global optimizer's begin_num_update differs from the saving job's:
    the states carry the steps made, and the servers count a round's update as
    begin_num_update + step + 1, so a job that also sets begin_num_update to the steps done
    (as a dist_sync script that resumes does) would count them twice."""
    if optimizer is None or saved.get("begin_num_update") is None:
        return
    if optimizer.begin_num_update != saved["begin_num_update"]:
        raise ValueError(
            "%s was saved by a job whose optimizer had begin_num_update=%d, after %d steps, "
            "which the states carry; this job's optimizer has begin_num_update=%d. dist_odsgd "
            "resumes the step count itself: create the optimizer with begin_num_update=%d, as "
            "the saving job did (setting it to the steps done counts them twice)"
            % (fname, saved["begin_num_update"], saved["global_step"],
               optimizer.begin_num_update, saved["begin_num_update"]))


def join_server_files(fname, layout):
    """Rank 0, after every server wrote the states of its pieces (`server_pattern`): joins them
    into the whole-parameter file `servers_file(fname)`, with `layout` recorded, and removes
    the servers' own files."""
    pattern = server_pattern(fname)
    paths = [pattern % k for k in range(num_servers())]
    files = [server_states.read(path, "the server states file") for path in paths]
    state_files.write_atomically(servers_file(fname), server_states.join(files, layout))
    for path in paths:
        os.unlink(path)


def check_server_file(fname, global_step):
    """ValueError when the servers' states beside `fname` are missing or of another step than
    `global_step` (the workers'); returns their path."""
    path = servers_file(fname)
    if not os.path.exists(path):
        raise ValueError("the servers' states %s are missing (written beside %s by rank 0's "
                         "save_optimizer_states)" % (path, fname))
    saved = server_states.read(path, "the servers' states file")
    if saved["global_step"] != global_step:
        raise ValueError("%s holds the servers' states after step %d, but the worker states "
                         "after step %d: a save was cut short; load an earlier checkpoint"
                         % (path, saved["global_step"], global_step))
    return path


def copy_server_file(path, fname):
    """Writes the servers' states file `path` as the servers' states of the worker states file
    `fname` (a save right after a load, before the servers had the loaded states)."""
    state_files.write_atomically(servers_file(fname),
                                 server_states.read(path, "the servers' states file"))
