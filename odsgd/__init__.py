"""odsgd: One-step Delay SGD (OD-SGD) for Apache MXNet 1.9, as a KVStore plugin.

    import odsgd            # registers kvstore type 'dist_odsgd'
    trainer = gluon.Trainer(net.collect_params(), 'sgd', {...}, kvstore='dist_odsgd')

See docs/spec.md for the update rules and docs/ for the environment variables.
"""
import importlib
import importlib.util
import os
import re
import sys

__version__ = "0.1.0"

_PUBLIC = {"DistODSGD": "worker.kvstore", "StoreType": "worker.kvstore",
           "load_global_weights": "worker.kvstore", "equal_steps": "worker.kvstore",
           "save_checkpoint": "worker.checkpoint", "load_checkpoint": "worker.checkpoint",
           "resume_or_start": "worker.checkpoint", "prepare_checkpoints": "worker.checkpoint",
           "ODSGDConfig": "worker.config", "LocalUpdater": "worker.local_update",
           "ServerOptimizer": "server.updater"}
#: what works without MXNet (the launcher reads checkpoint folders with it)
_WITHOUT_MXNET = {"latest_checkpoint": "common.checkpoint_index",
                  "step_prefix": "common.checkpoint_index",
                  "Checkpoint": "common.checkpoint_index"}
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
    """True while the launcher (`python -m odsgd.launch` locating its module, or the
    `odsgd-launch` console script importing it) imports this package: the launcher only starts
    processes and needs no MXNet, whose import would add seconds to every job's start.

    The console script is recognised by its name rather than pointed at a module outside
    this package: any `odsgd.*` entry point imports this __init__ first, and the name is all
    that tells it apart (pip's wrapper strips '-script.py' or '.exe' the same way)."""
    if re.sub(r"(-script\.pyw?|\.exe)$", "", os.path.basename(sys.argv[0] if sys.argv else "")) \
            == "odsgd-launch":
        return True
    if sys.argv[:1] != ["-m"]:   # what sys.argv holds while `python -m` finds the module
        return False
    return _module_run_by_interpreter() in ("odsgd.launch", "odsgd.cluster.launch")


def _module_run_by_interpreter():
    """NAME of `python [options] -m NAME ...`, or None: from sys.orig_argv (Python >= 3.10),
    else from the kernel's record of the command line (Linux; 3.8 and 3.9)."""
    argv = getattr(sys, "orig_argv", None)
    if argv is None:
        try:
            with open("/proc/self/cmdline", "rb") as f:
                argv = [os.fsdecode(a) for a in f.read().split(b"\0")[:-1]]
        except OSError:
            return None
    i = 1
    while i < len(argv) and argv[i].startswith("-") and argv[i] not in ("-", "--"):
        if argv[i].startswith("--"):   # --check-hash-based-pycs is the one that takes a value
            i += 2 if argv[i] == "--check-hash-based-pycs" else 1
            continue
        # a cluster of one-letter options, e.g. -u, -um NAME, -X importtime, -Wignore
        cluster = argv[i][1:]
        taking = next((at for at, letter in enumerate(cluster) if letter in "mcWX"), None)
        if taking is not None:
            value = cluster[taking + 1:] or (argv[i + 1] if i + 1 < len(argv) else None)
            if cluster[taking] in "mc":
                return value if cluster[taking] == "m" else None
            i += 0 if cluster[taking + 1:] else 1
        i += 1
    return None


# On a server or scheduler, MXNet starts its server loop inside `import mxnet` and never
# returns; while it runs it unpickles our ServerOptimizer, importing odsgd.server.updater.
# Importing nothing here keeps that module from being caught half-imported there.
if MXNET_INSTALLED and os.environ.get("DMLC_ROLE") not in ("server", "scheduler") \
        and not _launcher_process():
    from . import native
    native.load()
    from .worker.kvstore import (DistODSGD, StoreType,  # noqa: F401,E402
                                 equal_steps, load_global_weights)
    from .worker import trainer_hook
    trainer_hook.install()
    from .worker.checkpoint import (load_checkpoint,  # noqa: F401,E402
                                    prepare_checkpoints, resume_or_start, save_checkpoint)
    from .common.checkpoint_index import latest_checkpoint, step_prefix  # noqa: F401,E402
