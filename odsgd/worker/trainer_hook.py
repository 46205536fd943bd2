"""The worker-side hook: gluon.Trainer and Module hand a dist_odsgd store a whole step at once.

Both call the store once per parameter and step (`Trainer._allreduce_grads`, and
`mxnet.model._update_params_on_kvstore` for Module), so a store that acts per call pays its
fixed cost per parameter array. With dist_odsgd they make one call with every parameter's
key, gradients and weights instead, and the store issues one fused operator and one push and
pull per key group (odsgd/worker/kvstore.py, odsgd/worker/key_groups.py). For any other store both behave
exactly as MXNet's own code.

One override each, installed by `import odsgd` (as Horovod's and BytePS's DistributedTrainer
override `_allreduce_grads`), so `gluon.Trainer(..., kvstore='dist_odsgd')` and
`Module.fit(kvstore='dist_odsgd')` get it without a change to the user's code.

Between steps the parameter arrays may show an inference forward the global weights instead
of the local ones (odsgd/worker/eval_weights.py): each step first puts the local weights back, and
then tells eval_weights which arrays it wrote them into.

A Trainer on one of MXNet's own stores that is to be checkpointed (odsgd.resume_or_start
prepared it) also has its servers given the project's ServerOptimizer when it makes its store,
and its steps counted (odsgd/worker/mxnet_store_checkpoint.py): one more override,
`Trainer._init_kvstore`, which does nothing else.

This module imports nothing of odsgd but eval_weights and mxnet_store_checkpoint: the
package's __init__ imports it to install the overrides, and it knows a dist_odsgd store by its
type, not by the class in odsgd/worker/kvstore.py.
"""
import mxnet as mx
from mxnet.kvstore import KVStoreBase
from mxnet.module import module as _module

from . import eval_weights, mxnet_store_checkpoint

_TRAINER_ALLREDUCE = mx.gluon.Trainer._allreduce_grads
_TRAINER_INIT_KVSTORE = mx.gluon.Trainer._init_kvstore
_MODULE_UPDATE_ON_KVSTORE = _module._update_params_on_kvstore
STORE_TYPE = "dist_odsgd"   # DistODSGD.type


def _is_odsgd(kvstore):
    return isinstance(kvstore, KVStoreBase) and kvstore.type == STORE_TYPE


def allreduce_grads_in_one_call(trainer):
    """gluon.Trainer._allreduce_grads: with dist_odsgd (and update_on_kvstore, which it
    requires) one pushpull of every trained parameter; otherwise MXNet's own."""
    kvstore = trainer._kvstore
    if not (_is_odsgd(kvstore) and trainer._update_on_kvstore):
        mxnet_store_checkpoint.counted_step(trainer)
        return _TRAINER_ALLREDUCE(trainer)
    keys, grads, weights, trained = [], [], [], []
    for index, param in enumerate(trainer._params):
        if param.grad_req != "null":
            keys.append(index)
            grads.append(param.list_grad())
            weights.append(param.list_data())
            trained.append(id(param))
    _step(kvstore, keys, grads, weights, trained)


def init_kvstore_for_checkpoints(trainer):
    """gluon.Trainer._init_kvstore: MXNet's own, then, for a Trainer prepared for checkpoints
    on one of MXNet's dist stores, the servers' ServerOptimizer."""
    _TRAINER_INIT_KVSTORE(trainer)
    mxnet_store_checkpoint.after_store_made(trainer)


def update_params_on_kvstore_in_one_call(param_arrays, grad_arrays, kvstore, param_names):
    """mxnet.model._update_params_on_kvstore, as Module.update calls it: with dist_odsgd one
    pushpull of every parameter that has a gradient; otherwise MXNet's own."""
    if not _is_odsgd(kvstore):
        return _MODULE_UPDATE_ON_KVSTORE(param_arrays, grad_arrays, kvstore, param_names)
    keys, grads, weights = [], [], []
    for name, arrays, grad_list in zip(param_names, param_arrays, grad_arrays):
        if grad_list[0] is not None:
            keys.append(name)
            grads.append(grad_list)
            weights.append(arrays)
    _step(kvstore, keys, grads, weights)


def _step(kvstore, keys, grads, weights, trained=()):
    """One pushpull of the step, from the local weights (put back if the global ones were
    shown for an evaluation); `trained`: ids of a Trainer's Parameters whose blocks show the
    global weights when called for inference."""
    if not keys:
        return
    shown = eval_weights.shown_weights(kvstore)
    shown.restore_local()
    kvstore.pushpull(keys, grads, out=weights)
    shown.stepped(keys, weights, trained)


def install():
    """Installs the overrides and those of eval_weights (idempotent)."""
    mx.gluon.Trainer._allreduce_grads = allreduce_grads_in_one_call
    mx.gluon.Trainer._init_kvstore = init_kvstore_for_checkpoints
    _module._update_params_on_kvstore = update_params_on_kvstore_in_one_call
    eval_weights.install()
