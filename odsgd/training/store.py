"""The kvstore a training script asks for, and the global weights it evaluates and saves."""
import logging
import os

import mxnet as mx

import odsgd

LOG = logging.getLogger("odsgd.training")


def cluster_size(kvstore, environ=None):
    """Number of workers of the job, known before the store exists (DMLC_NUM_WORKER, set by
    the launcher); 1 for local stores. The schedules and the equal-steps rule need it first."""
    if not kvstore.startswith("dist"):
        return 1
    environ = os.environ if environ is None else environ
    text = environ.get("DMLC_NUM_WORKER")
    if not text:
        raise ValueError("--kvstore %s needs a parameter-server job: start the script with "
                         "`python -m odsgd.launch -n WORKERS -s SERVERS --launcher local "
                         "python SCRIPT ...`, or use --kvstore local" % kvstore)
    return int(text)


def odsgd_arguments(args, local_schedule=None):
    """DistODSGD's constructor arguments from the flags; None leaves a setting to the ODSGD_*
    environment and the defaults."""
    params = {}
    for flag, key in (("local_lr", "learning_rate"), ("local_momentum", "momentum"),
                      ("local_wd", "wd")):
        if getattr(args, flag) is not None:
            params[key] = getattr(args, flag)
    if local_schedule is not None:
        params["lr_scheduler"] = local_schedule
    return dict(local_optimizer=args.local_optimizer, local_optimizer_params=params or None,
                compensation=args.compensation, compensation_mode=args.compensation_mode,
                warmup_steps=args.warmup_steps)


def create_store(args, local_schedule=None):
    """The kvstore of --kvstore: a DistODSGD with the OD-SGD flags, or MXNet's own."""
    if args.kvstore == "dist_odsgd":
        return odsgd.DistODSGD(**odsgd_arguments(args, local_schedule))
    return mx.kv.create(args.kvstore)


def describe(kv):
    """One line for the log."""
    text = "kvstore %s, worker %d of %d" % (kv.type, kv.rank, kv.num_workers)
    if isinstance(kv, odsgd.DistODSGD):
        text += ", OD-SGD %s" % kv.config.as_dict()
    return text


def is_synchronous(kv):
    """True where one global update sums every worker's gradient (dist_sync, dist_odsgd):
    then gradients are rescaled by 1 / (batch x workers), as MXNet's Module does."""
    return kv is not None and "dist" in kv.type and "_sync" in kv.type


def can_save_states(kv):
    """MXNet's dist stores keep the optimizer states on the servers and cannot save them;
    local stores and dist_odsgd (its workers' local states) can."""
    return kv is None or not kv.type.startswith("dist") or isinstance(kv, odsgd.DistODSGD)


def load_global_weights(trainer_or_module, kv):
    """Puts the servers' newest weights into the parameters of a gluon.Trainer or a Module
    (before evaluating or saving; the training scripts read W with global_weights instead,
    which leaves the trained arrays alone). dist_odsgd: odsgd.load_global_weights (the
    worker's weights are one local step ahead); dist_sync/dist_async: a pull of every trained
    parameter; local stores: nothing to do."""
    if kv is None or not kv.type.startswith("dist"):
        return
    if isinstance(kv, odsgd.DistODSGD):
        odsgd.load_global_weights(trainer_or_module)
        return
    if isinstance(trainer_or_module, mx.gluon.Trainer):
        for index, param in enumerate(trainer_or_module._params):
            if param.grad_req != "null":
                kv.pull(index, out=param.list_data())
    else:                                              # Module
        group = trainer_or_module._exec_group
        for name, arrays in zip(group.param_names, group.param_arrays):
            kv.pull(name, out=arrays)
        trainer_or_module._params_dirty = True
    mx.nd.waitall()


def global_weights(trainer, kv):
    """{parameter name: a CPU copy of its global weights W}, for every parameter of a
    gluon.Trainer, read without touching the trained arrays: the trained parameters of a dist
    store are pulled from the servers into new arrays (under dist_odsgd the worker's own
    arrays hold w_t, one local step off W; under dist_async W moves on without this worker),
    the others (local stores, BatchNorm's running statistics) are copied from this worker's.

    Why not load_global_weights: it moves this worker's arrays to W, and under dist_odsgd
    (and dist_async) the next gradient is then taken at W instead of w_t: a run that
    evaluates between epochs would differ from one resumed past the evaluation."""
    copies, pulled = {}, []
    distributed = kv is not None and kv.type.startswith("dist")
    # trainer._params: the Trainer's parameters in sorted-name order, whose index is their key
    # in the store (gluon/trainer.py in MXNet 1.9.1)
    for index, param in enumerate(trainer._params):
        source = param.list_data()[0]
        copies[param.name] = mx.nd.empty(source.shape, ctx=mx.cpu(), dtype=source.dtype)
        if distributed and param.grad_req != "null":
            pulled.append((index, copies[param.name]))
        else:
            source.copyto(copies[param.name])
    if pulled:
        kv.pull([index for index, _ in pulled], out=[array for _, array in pulled])
    mx.nd.waitall()
    return copies


def global_module_params(module, kv):
    """(arg_params, aux_params) of a Module with the global weights W: copies of its own,
    the trained ones of a dist store pulled from the servers into them (see global_weights)."""
    arg_params, aux_params = module.get_params()
    arg_params = {name: array.copy() for name, array in arg_params.items()}
    aux_params = {name: array.copy() for name, array in aux_params.items()}
    if kv is not None and kv.type.startswith("dist"):
        names = [name for name in module._exec_group.param_names if name in arg_params]
        if names:
            kv.pull(names, out=[arg_params[name] for name in names])
    mx.nd.waitall()
    return arg_params, aux_params
