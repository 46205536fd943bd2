"""Whole checkpoints of a gluon.Trainer on MXNet's own stores (dist_sync, dist_async, local):
what `odsgd.save_checkpoint` and `odsgd.resume_or_start` do for them.

MXNet cannot save a dist store's optimizer states ("Cannot save states for distributed
training"): they live on the servers, inside MXNet's own updater. So a Trainer that is to be
checkpointed is *prepared* before its first step (`prepare`, which `odsgd.resume_or_start`
calls): when it creates its store, the servers are given the global optimizer wrapped in the
project's ServerOptimizer (odsgd/server/updater.py, the same optimizer's own update, with the
states kept per parameter) and each key's packing, so that they can write and read their
states as dist_odsgd's servers do. The training is unchanged: the servers apply the same
optimizer to the same sums.

| part                                               | file                              |
|----------------------------------------------------|-----------------------------------|
| worker r's weights (dist_sync: W; dist_async: the  | `<prefix>-worker<r>.params`       |
| worker's last pulled copy)                         |                                   |
| steps made, rescale_grad, the number of workers;   | `<prefix>-worker<r>.states`       |
| rank 0: the servers' W (dist stores); local stores:|                                   |
| the Trainer's own states                           |                                   |
| the servers' optimizer states, whole per parameter | `<prefix>-worker0.states.servers` |
| that the checkpoint is whole                       | `<prefix>.whole.json`             |

dist_sync resumes exactly; dist_async cannot (its workers' pushes interleave by timing), it
resumes from the same W, states and step count.
"""
import io
import os
import tempfile

import mxnet as mx
import numpy as np

from ..common import checkpoint_index, state_files
from ..server import schedules as server_schedules, updater as server_updater
from . import states as worker_states
from .weights_files import checkpoint_files, save_weights_atomically

#: version of the worker states files written here
FORMAT = 1


def trainer_store(trainer):
    """The Trainer's store once it has made it; before, what it was given: a store, its name,
    or None (odsgd/worker/checkpoint.py asks it too)."""
    return trainer._kvstore if trainer._kv_initialized else trainer._kvstore_params["kvstore"]


def store_made_now(trainer):
    """Before the Trainer's first step: the store it was given, made here from its name where
    that is a dist store's ('dist_sync', 'dist_odsgd', ...) and handed to the Trainer, so that
    the rank can be read before the Trainer would make it; a local store's name, or None, as
    it is (odsgd/worker/checkpoint.py loads with it too)."""
    kv = trainer._kvstore_params["kvstore"]
    if isinstance(kv, str) and kv.lower().startswith("dist"):
        kv = mx.kv.create(kv)
        trainer._kvstore_params["kvstore"] = kv
    return kv


def store_name(trainer):
    """The type of the Trainer's store: its name before the store exists, 'local' where the
    Trainer made none (one device)."""
    kv = trainer_store(trainer)
    if kv is None:
        return "local"
    return kv if isinstance(kv, str) else kv.type


def prepare(trainer):
    """Makes `trainer`'s servers keep states that a checkpoint can save (see the module's
    docstring); before its first step."""
    if trainer._kv_initialized and not getattr(trainer, "_odsgd_checkpointed", False):
        raise ValueError("odsgd.resume_or_start (or prepare_checkpoints) must come before the "
                         "first trainer.step with kvstore=%r: a checkpoint counts the steps "
                         "from there, and a dist store's servers keep the optimizer's states "
                         "where it can save them only when told before" % store_name(trainer))
    trainer._odsgd_checkpointed = True
    trainer._odsgd_steps = getattr(trainer, "_odsgd_steps", 0)


def after_store_made(trainer):
    """Called by the Trainer hook (odsgd/worker/trainer_hook.py) when a prepared Trainer has made its
    store: a dist store's servers get the ServerOptimizer and every parameter's packing."""
    kv = trainer._kvstore
    if not getattr(trainer, "_odsgd_checkpointed", False) or kv is None or \
            "dist" not in kv.type or not trainer._update_on_kvstore:
        return
    sent = trainer._optimizer
    scheduler = server_schedules.server_safe(sent.lr_scheduler)
    if scheduler is not sent.lr_scheduler:   # GluonCV's schedules do not unpickle there
        import copy
        sent = copy.copy(sent)
        sent.lr_scheduler = scheduler
    kv.set_optimizer(server_updater.ServerOptimizer(sent))
    server_updater.send_command(kv, server_updater.group_packings_command(
        {index: [(index, 0, int(np.prod(param.shape)), -1)]
         for index, param in enumerate(trainer._params) if param.shape and
         all(d > 0 for d in param.shape)}))


def counted_step(trainer):
    """One step of a prepared Trainer (the hook calls it per step)."""
    if getattr(trainer, "_odsgd_checkpointed", False):
        trainer._odsgd_steps += 1


def _check_prepared(trainer, what):
    if not getattr(trainer, "_odsgd_checkpointed", False):
        raise ValueError("%s with kvstore=%r needs odsgd.resume_or_start(trainer, directory) "
                         "(or odsgd.prepare_checkpoints(trainer)) before the first "
                         "trainer.step: a checkpoint counts the steps from there, and a dist "
                         "store's servers keep their states where it can save them only when "
                         "told before" % (what, store_name(trainer)))


def save(trainer, prefix, extra=None):
    """odsgd.save_checkpoint for a prepared Trainer on one of MXNet's stores. Returns the files
    this worker wrote."""
    if not trainer._kv_initialized or trainer._params_to_init:
        raise ValueError("save_checkpoint before the first trainer.step: there is nothing to "
                         "save yet")
    _check_prepared(trainer, "save_checkpoint")
    kv, name = trainer._kvstore, store_name(trainer)
    distributed = kv is not None and "dist" in kv.type
    rank, workers = (kv.rank, kv.num_workers) if kv is not None else (0, 1)
    params_file, states_file = checkpoint_files(prefix, rank)
    if rank == 0:
        checkpoint_index.remove_marker(prefix)
    mx.nd.waitall()   # this worker's pushes are applied, its last pull has arrived
    if distributed:
        kv._barrier()   # every worker's: the servers' W and states are of the same step
    _save_weights(params_file, trainer)
    saved = {"format": FORMAT, "store": name, "rank": rank, "num_workers": workers,
             "step": trainer._odsgd_steps, "rescale_grad": trainer._optimizer.rescale_grad,
             "global_weights": _servers_weights(trainer) if distributed and rank == 0
             else None,
             "trainer_states": None if distributed else _trainer_states(trainer)}
    state_files.write_atomically(states_file, saved)
    if distributed and rank == 0:
        server_updater.send_command(kv, server_updater.save_states_command(
            worker_states.server_pattern(states_file), trainer._odsgd_steps))
        worker_states.join_server_files(states_file, {"store": name})
    if distributed:
        kv._barrier()
    if rank == 0:
        files = [f for r in range(workers) for f in checkpoint_files(prefix, r)]
        files += [worker_states.servers_file(states_file)] if distributed else []
        checkpoint_index.write_marker(prefix, trainer._odsgd_steps, name, workers, files,
                                      extra)
    return params_file, states_file


def load(trainer, prefix):
    """odsgd.load_checkpoint for a Trainer on one of MXNet's stores, before its first step."""
    prepare(trainer)
    if trainer._kv_initialized:
        raise ValueError("load_checkpoint must come before the first trainer.step")
    kv = store_made_now(trainer)
    rank = kv.rank if isinstance(kv, mx.kvstore.KVStoreBase) else 0
    params_file, states_file = checkpoint_files(prefix, rank)
    saved = _read_states(states_file, prefix, kv)
    trainer._optimizer.rescale_grad = saved["rescale_grad"]   # what the saving job's step set
    own = mx.nd.load(params_file)
    _set_parameters(trainer, saved["global_weights"] or own, params_file)
    trainer._init_kvstore()   # the servers get the ServerOptimizer (after_store_made)
    trainer._init_params()    # rank 0's weights (the servers' W) to the servers
    distributed = trainer._kvstore is not None and "dist" in trainer._kvstore.type
    if distributed:
        if rank == 0:
            path = worker_states.check_server_file(states_file, saved["step"])
            server_updater.send_command(trainer._kvstore, server_updater.load_states_command(
                path, saved["step"], list(range(len(trainer._params)))))
        trainer._kvstore._barrier()   # no worker pushes before the servers have the states
    else:
        _load_trainer_states(trainer, saved["trainer_states"])
    _set_parameters(trainer, own, params_file)
    trainer._odsgd_steps = saved["step"]
    mx.nd.waitall()


def _read_states(states_file, prefix, kv):
    """This worker's saved states, checked against the job (ValueError naming the fix)."""
    import pickle
    workers = kv.num_workers if isinstance(kv, mx.kvstore.KVStoreBase) else 1
    if not os.path.exists(states_file):
        raise ValueError("%s is missing: no checkpoint of this worker at prefix %s (a job of "
                         "%d workers resumes the checkpoint of one of as many)"
                         % (states_file, prefix, workers))
    with open(states_file, "rb") as f:
        saved = pickle.load(f)
    if not isinstance(saved, dict) or saved.get("format") != FORMAT:
        raise ValueError("%s is not a checkpoint of a Trainer on MXNet's stores of this "
                         "version" % states_file)
    worker_states.check_num_workers(states_file, saved, workers)
    return saved


def _save_weights(path, trainer):
    save_weights_atomically(path, {p.name: p.list_data()[0] for p in trainer._params})


def _servers_weights(trainer):
    """{parameter name: NumPy} of the servers' newest weights (rank 0, after the barrier)."""
    params = trainer._params
    pulled = [mx.nd.zeros(param.shape, dtype=param.dtype) for param in params]
    trainer._kvstore.pull(list(range(len(params))), out=pulled)   # one call, every key
    return {param.name: array.asnumpy() for param, array in zip(params, pulled)}


def _set_parameters(trainer, values, params_file):
    for param in trainer._params:
        if param.name not in values:
            raise ValueError("%s has no weights for parameter %r" % (params_file, param.name))
        value = values[param.name]
        for array in param.list_data():
            array[:] = value if isinstance(value, np.ndarray) else \
                value.as_in_context(array.context)


def _trainer_states(trainer):
    """The bytes of trainer.save_states (a local store keeps the states on the worker)."""
    handle, path = tempfile.mkstemp(suffix=".states")
    os.close(handle)
    try:
        trainer.save_states(path)
        with open(path, "rb") as f:
            return f.read()
    finally:
        os.unlink(path)


def _load_trainer_states(trainer, data):
    handle, path = tempfile.mkstemp(suffix=".states")
    with io.open(handle, "wb", closefd=True) as f:
        f.write(data)
    try:
        trainer.load_states(path)
    finally:
        os.unlink(path)
