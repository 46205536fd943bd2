"""Evaluating the global model: an inference forward between training steps sees W, not w_t.

Under dist_odsgd a worker's parameter arrays hold its local weights w_t, one local step away
from the servers' global weights W (docs/spec.md, section 4), and each worker's w_t differs from the
others'. Scripts that evaluate the network they train (MXNet's fit.py scores `eval_data` with
the Module after every epoch; GluonCV's scripts call `net(x)` outside `autograd.record()`)
would report w_t. With `ODSGD_EVAL_WEIGHTS=global` (the default, docs/env.md) the store's
parameter arrays show W to them instead, and w_t comes back before the next training step:

* an inference forward (`Module.forward(is_train=False)`, which `score`/`predict` call, or a
  Gluon block that holds a trained parameter, called while autograd is not recording) and
  `Module.get_params` (fit.py's checkpoints) first copy w_t aside and pull W into the arrays;
* a training forward, and the store's next step (odsgd/worker/trainer_hook.py), copy w_t back, so
  the local trajectory is exactly the one without evaluations.

What a script does while W is shown stays right:

* a value it writes into a parameter (an EMA evaluation's `p.data()[:] = ema`) is kept, never
  replaced by w_t (the arrays are compared with W as shown when w_t comes back);
* gradients are taken at w_t: a backward (Gluon's `autograd.backward`, `NDArray.backward`)
  puts w_t back first, so a Gluon inference call between a recorded forward and its backward
  changes nothing; `Module.backward` right after `Module.forward(is_train=False)` is a
  ValueError naming the fix (that forward ran at W, and re-running it would change
  BatchNorm's statistics);
* only the thread that makes the store's steps swaps: autograd's recording flag is per thread,
  and an evaluation in another thread would swap W in under the training thread's forward;
  there the parameters stay w_t (logged once);
* an interrupt (Ctrl-C) inside the swap leaves nothing behind: the arrays are marked as
  showing W before the first one is written, and w_t is kept aside whole before that.

BatchNorm's running statistics are not parameters of the store: they stay the worker's own,
as under dist_sync. Why W and what it costs: docs/convergence.md, "MXNet's own scripts".
"""
import logging
import threading
import weakref

import mxnet as mx
from mxnet.module import module as _module

LOG = logging.getLogger("odsgd")

#: what the arrays hold (ShownWeights.holds); GLOBAL and LOCAL are also ODSGD_EVAL_WEIGHTS's
GLOBAL, LOCAL, USER = "global", "local", "user"

_MODULE_FORWARD = _module.Module.forward
_MODULE_GET_PARAMS = _module.Module.get_params
_MODULE_SET_PARAMS = _module.Module.set_params
_MODULE_BACKWARD = _module.Module.backward
_BLOCK_CALL = mx.gluon.Block.__call__
_AUTOGRAD_BACKWARD = mx.autograd.backward
_NDARRAY_BACKWARD = mx.nd.NDArray.backward


class ShownWeights(object):
    """What one dist_odsgd store's parameter arrays hold between its training steps.

    `holds` is 'local' (w_t, written by the last step), 'global' (W, pulled for an inference
    forward, with w_t kept aside in `aside`) or 'user' (values the store did not write: before
    the first step, or set by the user since; shown as they are)."""

    def __init__(self, kvstore):
        # A weak reference: _SHOWN lives as long as the process, and a store kept alive to
        # the interpreter's exit outlives MXNet's engine (its threads abort the process).
        self._store = weakref.ref(kvstore)
        self.holds = USER
        self.keys, self.arrays = [], []   # what the last step wrote w_t into (per device)
        self.owners = frozenset()         # ids of the Gluon Parameters trained (Gluon only)
        self.aside = []                   # a copy of w_t per key, while W is shown
        self.shown = []                   # W per key as shown, to see what the user wrote
        self.shown_whole = False          # `shown` holds every key's W (the swap finished)
        self.thread = None                # the thread that makes the store's steps
        self._told = set()                # what was logged once

    def stepped(self, keys, arrays, owners=()):
        """The store's step wrote w_t into `arrays` (one list of device arrays per key)."""
        self.keys, self.arrays, self.owners = list(keys), list(arrays), frozenset(owners)
        self.holds = LOCAL
        self.thread = threading.get_ident()

    def show_global(self):
        """Pulls W into the arrays, w_t aside, when they hold w_t that differs from W and the
        store evaluates the global model (from the training thread only)."""
        kvstore = self._store()
        if self.holds != LOCAL or kvstore is None or not _differs_from_global(kvstore) or \
                not self._in_training_thread():
            return
        if [a.shape for a in self.aside] != [a[0].shape for a in self.arrays]:
            self.aside = [mx.nd.empty(a[0].shape, a[0].context, a[0].dtype)
                          for a in self.arrays]
            self.shown = [mx.nd.empty(a[0].shape, a[0].context, a[0].dtype)
                          for a in self.arrays]
        for devices, copy in zip(self.arrays, self.aside):
            devices[0].copyto(copy)
        # Marked before the first array is written: an interrupt inside the pull leaves a
        # state that restore_local puts right (every key's w_t is aside).
        self.shown_whole = False
        self.holds = GLOBAL
        kvstore.pull(self.keys, out=self.arrays)
        for devices, copy in zip(self.arrays, self.shown):
            devices[0].copyto(copy)
        self.shown_whole = True

    def restore_local(self):
        """Copies w_t back into the arrays if W is shown, except into those the user wrote
        since (MXNet's engine orders the copies after the inference forward's reads, without
        a wait); True if it did."""
        if self.holds != GLOBAL or not self._in_training_thread():
            return False
        # Paused: a Gluon training forward restores inside autograd.record(), where writing
        # into a parameter (a variable of the graph) is refused; the copy is no part of it.
        with mx.autograd.pause():
            written = self._written_by_user() if self.shown_whole else set()
            for position, (devices, copy) in enumerate(zip(self.arrays, self.aside)):
                if position not in written:
                    for array in devices:
                        copy.copyto(array)
        if written:
            self._tell_once("written", "odsgd: %d parameter(s) were written while the global "
                            "weights were shown (e.g. an EMA evaluation): their values are "
                            "kept as written, the next step starts from them" % len(written))
        self.holds = LOCAL
        return True

    def _written_by_user(self):
        """Positions of the keys whose arrays differ from W as it was shown: written by the
        user since. One wait, once per evaluation.

        `shown` lives on the first device's context: each device's array is compared with a
        copy on its own context (as_in_context returns `shown` itself on the first), and the
        counts meet on that first context. MXNet checks only that an operator's inputs are of
        one device type, so a comparison across two GPUs would read one GPU's memory from a
        kernel of the other."""
        counts = []
        for devices, shown in zip(self.arrays, self.shown):
            home = shown.context
            per_device = [(array != shown.as_in_context(array.context)).sum()
                          .as_in_context(home) for array in devices]
            counts.append(mx.nd.add_n(*per_device).reshape((1,)))
        if not counts:
            return set()
        differ = mx.nd.concat(*[c.as_in_context(mx.cpu()) for c in counts], dim=0).asnumpy()
        return {position for position, count in enumerate(differ) if count}

    def _in_training_thread(self):
        if self.thread is None or threading.get_ident() == self.thread:
            return True
        self._tell_once("thread", "odsgd: an inference call in another thread than the "
                        "training loop's sees this worker's weights w_t, not the global W: "
                        "autograd's recording flag is per thread, and showing W there would "
                        "put it under the training thread's forward (evaluate in the training "
                        "thread, or copy W with odsgd.load_global_weights)")
        return False

    def _tell_once(self, what, message):
        if what not in self._told:
            self._told.add(what)
            LOG.info(message)

    def forget(self):
        """The user set the arrays: they hold neither w_t nor W until the next step."""
        self.holds = USER


def _differs_from_global(kvstore):
    # Warm-up steps write W itself (w_{t+1} = W_{t+1}): nothing to show until an OD step.
    config = kvstore.config
    return config.eval_weights == GLOBAL and kvstore.global_step > config.warmup_steps


_SHOWN = weakref.WeakKeyDictionary()   # store -> ShownWeights


def shown_weights(kvstore):
    """The ShownWeights of a dist_odsgd store (made on first use)."""
    if kvstore not in _SHOWN:
        _SHOWN[kvstore] = ShownWeights(kvstore)
    return _SHOWN[kvstore]


def _known(kvstore):
    """The ShownWeights of a store that has made a dist_odsgd step, else None."""
    try:
        return _SHOWN.get(kvstore)
    except TypeError:      # None, or a store's name (not weakly referable)
        return None


# -- Module ------------------------------------------------------------------------------------
def module_forward(module, data_batch, is_train=None):
    """Module.forward: an inference forward shows W, a training forward w_t."""
    shown = _known(module._kvstore)
    if shown is not None:
        training = module.for_training if is_train is None else is_train
        if training:
            if shown.restore_local():
                module._params_dirty = True
        else:
            shown.show_global()
        # a backward after this forward must not take gradients at W (module_backward)
        module._odsgd_forward_at_global = not training and shown.holds == GLOBAL
    return _MODULE_FORWARD(module, data_batch, is_train)


def module_backward(module, out_grads=None):
    """Module.backward: refused right after an inference forward that ran at W; otherwise w_t
    is put back first (the weights are read again by the backward)."""
    shown = _known(module._kvstore)
    if shown is not None:
        if getattr(module, "_odsgd_forward_at_global", False) and shown.holds == GLOBAL:
            raise ValueError(
                "dist_odsgd: Module.backward right after forward(is_train=False): that forward "
                "ran at the global weights W, which inference calls see "
                "(ODSGD_EVAL_WEIGHTS=global), and gradients must be taken at this worker's "
                "weights w_t. Call forward(data_batch, is_train=True) before backward (or set "
                "ODSGD_EVAL_WEIGHTS=local)")
        if shown.restore_local():
            module._params_dirty = True
    return _MODULE_BACKWARD(module, out_grads)


def module_get_params(module):
    """Module.get_params: the global model's parameters (fit.py checkpoints them after every
    epoch, then hands them back to set_params, which leaves W shown)."""
    shown = _known(module._kvstore)
    if shown is not None and shown.holds == LOCAL:
        shown.show_global()
        if shown.holds == GLOBAL:
            module._params_dirty = True   # _arg_params are synchronised from the arrays
    return _MODULE_GET_PARAMS(module)


def module_set_params(module, arg_params, aux_params, *args, **kwargs):
    """Module.set_params: values of the user's own replace whatever was shown (fit.py's
    set_params(get_params()) hands the module its own dict back and changes nothing)."""
    shown = _known(module._kvstore)
    if shown is not None and arg_params is not module._arg_params:
        shown.forget()
    return _MODULE_SET_PARAMS(module, arg_params, aux_params, *args, **kwargs)


# -- Gluon -------------------------------------------------------------------------------------
_BLOCK_PARAMETERS = weakref.WeakKeyDictionary()   # block -> ids of the Parameters it holds


def _holds_trained(block, shown):
    if block not in _BLOCK_PARAMETERS:
        _BLOCK_PARAMETERS[block] = frozenset(id(p) for p in block.collect_params().values())
    return not shown.owners.isdisjoint(_BLOCK_PARAMETERS[block])


def block_call(block, *args):
    """Block.__call__: a block holding a trained parameter, called while autograd does not
    record, shows W; called while it records, w_t. Blocks of no dist_odsgd Trainer (data
    transforms, losses) change nothing."""
    if _SHOWN:
        recording = mx.autograd.is_recording()
        for shown in list(_SHOWN.values()):
            if not shown.owners:
                continue
            if recording:
                shown.restore_local()
            elif shown.holds == LOCAL and _holds_trained(block, shown):
                shown.show_global()
    return _BLOCK_CALL(block, *args)


def autograd_backward(heads, head_grads=None, retain_graph=False, train_mode=True):
    """mx.autograd.backward: w_t back in the parameters first, so that gradients are taken at
    w_t even where an inference call showed W after the recorded forward."""
    _restore_every_store()
    return _AUTOGRAD_BACKWARD(heads, head_grads, retain_graph, train_mode)


def ndarray_backward(array, out_grad=None, retain_graph=False, train_mode=True):
    """NDArray.backward: as autograd_backward."""
    _restore_every_store()
    return _NDARRAY_BACKWARD(array, out_grad, retain_graph, train_mode)


def _restore_every_store():
    for shown in list(_SHOWN.values()):
        shown.restore_local()


def install():
    """Installs the overrides (idempotent); odsgd/worker/trainer_hook.py calls it."""
    _module.Module.forward = module_forward
    _module.Module.backward = module_backward
    _module.Module.get_params = module_get_params
    _module.Module.set_params = module_set_params
    mx.gluon.Block.__call__ = block_call
    mx.autograd.backward = autograd_backward
    mx.nd.NDArray.backward = ndarray_backward
