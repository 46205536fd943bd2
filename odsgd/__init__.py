"""odsgd: One-step Delay SGD (OD-SGD) for Apache MXNet 1.9, as a KVStore plugin.

    import odsgd            # registers kvstore type 'dist_odsgd'
    trainer = gluon.Trainer(net.collect_params(), 'sgd', {...}, kvstore='dist_odsgd')

See SPEC.md for the update rules and docs/ for the environment variables.
"""
import importlib
import importlib.util
import os
import sys

__version__ = "0.1.0"

_PUBLIC = {"DistODSGD": "kvstore", "StoreType": "kvstore", "load_global_weights": "kvstore",
           "equal_steps": "kvstore", "save_checkpoint": "checkpoint",
           "load_checkpoint": "checkpoint", "ODSGDConfig": "config",
           "LocalUpdater": "local_update", "ServerOptimizer": "server_updater"}
#: what works without MXNet (the launcher reads checkpoint folders with it)
_WITHOUT_MXNET = {"latest_checkpoint": "checkpoint_index", "Checkpoint": "checkpoint_index"}
__all__ = sorted(set(_PUBLIC) | set(_WITHOUT_MXNET))


def _mxnet_installed():
    try:
        return importlib.util.find_spec("mxnet") is not None
    except (ImportError, ValueError):
        return False


#: False on a machine without MXNet, where only tools that do not need it work (`python -m
#: odsgd.native check-gpu`, which runs the CUDA kernels against NumPy on a GPU that MXNet
#: 1.9.1's wheels cannot use); the store and everything else say what to install.
MXNET_INSTALLED = _mxnet_installed()


def __getattr__(name):
    if name in _WITHOUT_MXNET:
        return getattr(importlib.import_module("." + _WITHOUT_MXNET[name], __name__), name)
    if name in _PUBLIC:
        if not MXNET_INSTALLED:
            raise ImportError("odsgd.%s needs MXNet, which is not installed: pip install "
                              "mxnet==1.9.1 numpy==1.23.5 (GPU: mxnet-cu112; see the README)"
                              % name)
        return getattr(importlib.import_module("." + _PUBLIC[name], __name__), name)
    raise AttributeError("module 'odsgd' has no attribute %r" % name)


def _launcher_process():
    """True while `python -m odsgd.launch` locates its module: the launcher only starts
    processes and needs no MXNet, whose import would add seconds to every job's start."""
    argv = getattr(sys, "orig_argv", [])
    return sys.argv[:1] == ["-m"] and "-m" in argv and \
        argv[argv.index("-m") + 1:argv.index("-m") + 2] == ["odsgd.launch"]


# On a server or scheduler, MXNet starts its server loop inside `import mxnet` and never
# returns; while it runs it unpickles our ServerOptimizer, importing odsgd.server_updater.
# Importing nothing here keeps that module from being caught half-imported there.
if MXNET_INSTALLED and os.environ.get("DMLC_ROLE") not in ("server", "scheduler") \
        and not _launcher_process():
    from . import native
    native.load()
    from .kvstore import DistODSGD, StoreType, equal_steps, load_global_weights  # noqa: F401,E402
    from . import trainer_hook
    trainer_hook.install()
    from .checkpoint import load_checkpoint, save_checkpoint  # noqa: F401,E402
