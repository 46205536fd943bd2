"""Checkpoints of a dist_odsgd job that resume exactly: a job that runs k steps, saves, and a
new job that loads and runs N - k more steps end with the same weights as one job of N steps.

    odsgd.save_checkpoint(trainer, "ckpt/epoch3")    # every worker, after the same step
    ...
    odsgd.load_checkpoint(trainer, "ckpt/epoch3")    # every worker, before the first step
    step = odsgd.resume_or_start(trainer, "ckpt")    # the newest whole one in ckpt/, if any

What a dist_odsgd job's state is, and where each part goes:

| part                                              | file                                  |
|---------------------------------------------------|---------------------------------------|
| worker r's own weights w^i (one local step off W) | `<prefix>-worker<r>.params`           |
| worker r's local states (momentum m^i, variance   | `<prefix>-worker<r>.states`           |
| v^i), step counts, W_t and W_{t-1}, update count, |                                       |
| begin_num_update, the key layout                  |                                       |
| the servers' global optimizer states (e.g. SGD    | `<prefix>-worker0.states.servers`,    |
| momentum), whole per parameter, and update counts | joined by rank 0 from the servers'    |
|                                                   | own files (odsgd/server/states.py)    |
| that the checkpoint is whole: written last, by    | `<prefix>.whole.json`                 |
| rank 0 after every worker saved                   | (odsgd/common/checkpoint_index.py)           |

The servers write their own files, so in a job over several machines `<prefix>` must be on a
file system that the servers and rank 0 share. A checkpoint loads into a job with the same
number of workers and the same parameters; the number of servers, ODSGD_PART_ELEMENTS and
ODSGD_FUSION_ELEMENTS may differ from the saving job's (nothing saved depends on them), and
the optimizer's begin_num_update must be the saving job's.
"""
import os

import mxnet as mx

from ..common import checkpoint_index, state_files
from . import eval_weights, mxnet_store_checkpoint, states as worker_states
from .weights_files import checkpoint_files, file_crc32, save_weights_atomically

#: The type of the store these helpers are for (DistODSGD.type). They know the store by it,
#: not by its class: this module sits below odsgd/worker/kvstore.py and imports nothing of it.
STORE_TYPE = "dist_odsgd"


def is_odsgd_store(kv):
    """Whether `kv` is a dist_odsgd store (a DistODSGD): an MXNet KVStore (KVStoreBase)
    whose type is 'dist_odsgd'."""
    return isinstance(kv, mx.kvstore.KVStoreBase) and getattr(kv, "type", None) == STORE_TYPE


def _store(trainer, what):
    """Whether `trainer` trains with dist_odsgd (False: one of MXNet's own stores, which
    odsgd/worker/mxnet_store_checkpoint.py saves)."""
    if not isinstance(trainer, mx.gluon.Trainer):
        raise TypeError("%s needs a gluon.Trainer, got %r" % (what, type(trainer).__name__))
    kv = mxnet_store_checkpoint.trainer_store(trainer)
    return is_odsgd_store(kv) or (isinstance(kv, str) and kv.lower() == STORE_TYPE)


def save_checkpoint(trainer, prefix, extra=None):
    """Saves the whole training state of this worker and, from rank 0, of the servers (see
    the module's table), then, once every worker has saved, rank 0 writes the checkpoint's
    marker (odsgd/common/checkpoint_index.py): only a checkpoint with its marker is whole. Call it
    on every worker after the same step. `extra`: a dict recorded in the marker (e.g. the
    epoch and the batch within it). Returns the files this worker wrote."""
    if not _store(trainer, "save_checkpoint"):
        return mxnet_store_checkpoint.save(trainer, prefix, extra)
    if not trainer._kv_initialized or trainer._params_to_init:
        raise ValueError("save_checkpoint before the first trainer.step: there is nothing to "
                         "save yet")
    kv = trainer._kvstore
    # Before any file: a save after a failed step would replace the weights of the last good
    # checkpoint at this prefix and then be refused.
    kv.failed_step.check("save_checkpoint")
    # The parameters may show W to an evaluation (odsgd/worker/eval_weights.py): w^i is saved.
    eval_weights.shown_weights(kv).restore_local()
    params_file, states_file = checkpoint_files(prefix, kv.rank)
    if kv.rank == 0:
        checkpoint_index.remove_marker(prefix)
    kv._barrier()   # no worker writes while an old marker still calls this prefix whole
    mx.nd.waitall()
    save_weights_atomically(params_file, {param.name: param.list_data()[0]
                                          for param in trainer._params})
    # The states name the weights file they belong to: a save cut short between the two
    # files (the same prefix saved again) is refused on load instead of resuming wrong.
    kv.weights_file = {"name": os.path.basename(params_file), "crc32": file_crc32(params_file)}
    try:
        trainer.save_states(states_file)   # kv.save_optimizer_states, servers too on rank 0
    finally:
        kv.weights_file = None
    kv._barrier()   # every worker's files, and the servers' (joined by rank 0), are written
    if kv.rank == 0:
        checkpoint_index.write_marker(prefix, kv.global_step, STORE_TYPE, kv.num_workers,
                                      whole_checkpoint_files(prefix, kv.num_workers), extra)
    return params_file, states_file


def whole_checkpoint_files(prefix, num_workers):
    """Every file of a whole dist_odsgd checkpoint of `num_workers` workers."""
    files = [f for rank in range(num_workers) for f in checkpoint_files(prefix, rank)]
    return files + [worker_states.servers_file(checkpoint_files(prefix, 0)[1])]


def _worker_states(prefix, kv):
    """This worker's saved states, after the number of workers is checked: a job with more
    workers than the saving job finds no file of its rank (named in the error)."""
    states_file = checkpoint_files(prefix, kv.rank)[1]
    if not os.path.exists(states_file):
        first = checkpoint_files(prefix, 0)[1]
        if kv.rank > 0 and os.path.exists(first):
            worker_states.check_num_workers(
                first, state_files.load_worker_states(first, 0), kv.num_workers)
        raise ValueError("%s is missing: no checkpoint of worker %d at prefix %s"
                         % (states_file, kv.rank, prefix))
    saved = state_files.load_worker_states(states_file, kv.rank)
    worker_states.check_num_workers(states_file, saved, kv.num_workers)
    return saved


def prepare_checkpoints(trainer):
    """Makes a gluon.Trainer on one of MXNet's own stores (dist_sync, dist_async, local)
    checkpointable with save_checkpoint, before its first step (resume_or_start does it too);
    nothing to do for dist_odsgd."""
    if not _store(trainer, "prepare_checkpoints"):
        mxnet_store_checkpoint.prepare(trainer)


def resume_or_start(trainer, directory):
    """Loads the newest whole checkpoint in `directory` (odsgd.latest_checkpoint) into a
    gluon.Trainer that trains with dist_odsgd, as load_checkpoint does, and returns the global
    step it was saved after; returns 0 where `directory` holds none (the job starts fresh).
    Call it on every worker after the parameters are initialised and before the first
    trainer.step; every worker must see the same folder (a file system they share)."""
    _store(trainer, "resume_or_start")
    return resume_from(trainer, checkpoint_index.latest_checkpoint(directory))


def resume_from(trainer, found):
    """resume_or_start with its checkpoint looked up already: `found`, a
    checkpoint_index.Checkpoint, or None (the job starts fresh: returns 0)."""
    odsgd_store = _store(trainer, "resume_or_start")
    prepare_checkpoints(trainer)
    if found is None:
        return 0
    name = STORE_TYPE if odsgd_store else mxnet_store_checkpoint.store_name(trainer)
    if found.store != name:
        raise ValueError("%s was saved with kvstore %r; this Trainer trains with %r: resume it "
                         "with the store that saved it" % (found.marker, found.store, name))
    load_checkpoint(trainer, found.prefix)
    return found.step


def check_weights_file(params_file, states_file, saved):
    """ValueError when the weights file is not the one the states were saved with."""
    recorded = saved.get("weights_file")
    if recorded is None:
        return   # states saved by trainer.save_states alone: no weights file to match
    if file_crc32(params_file) != recorded["crc32"]:
        raise ValueError(
            "%s is not the weights file that %s was saved with (a save to this prefix was cut "
            "short between the two files, or one of them was replaced): load an earlier "
            "checkpoint" % (params_file, states_file))


def load_checkpoint(trainer, prefix):
    """Loads what save_checkpoint wrote into a new job: the global weights W_t reach the
    servers when the store initialises its keys from rank 0's parameters, then the states
    of the workers and servers are loaded and each worker's parameters are set to its own
    weights w^i. Call it on every worker after the parameters are initialised (shapes known)
    and before the first trainer.step."""
    if not _store(trainer, "load_checkpoint"):
        return mxnet_store_checkpoint.load(trainer, prefix)
    if trainer._kv_initialized:
        raise ValueError("load_checkpoint must come before the first trainer.step (the servers "
                         "take the global weights from rank 0's parameters when the store is "
                         "created)")
    kv = mxnet_store_checkpoint.store_made_now(trainer)   # to read the rank first
    if not is_odsgd_store(kv):
        raise ValueError("load_checkpoint is for a Trainer with kvstore='dist_odsgd'; this one "
                         "has kvstore=%r" % (kv,))
    params_file, states_file = checkpoint_files(prefix, kv.rank)
    saved = _worker_states(prefix, kv)
    check_weights_file(params_file, states_file, saved)
    local = mx.nd.load(params_file)
    global_weights = {key: current for key, (current, _previous)
                      in saved["global_weights"].items()}
    if saved.get("optimizer") is not None:
        # What the saving job's trainer.step set; the servers get it with the optimizer.
        trainer._optimizer.rescale_grad = saved["optimizer"].rescale_grad
    trainer._init_kvstore()
    for index, param in enumerate(trainer._params):
        if param.name not in local:
            raise ValueError("%s has no weights for parameter %r" % (params_file, param.name))
        if index in global_weights:
            for array in param.list_data():
                array[:] = global_weights[index]
    trainer._init_params()             # W_t to the servers (rank 0's values)
    trainer.load_states(states_file)   # kv.load_optimizer_states, servers included on rank 0
    for param in trainer._params:
        for array in param.list_data():
            array[:] = local[param.name].as_in_context(array.context)
    mx.nd.waitall()
