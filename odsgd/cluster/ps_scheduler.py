"""A job's ps-lite scheduler, run by odsgd.launch in place of the training command.

MXNet's tools/launch.py starts the scheduler by running the training command with
DMLC_ROLE=scheduler: the command gets as far as `import mxnet`, whose last line
(mxnet/kvstore/kvstore_server.py, `_init_kvstore_server_module`) creates a 'dist' store, runs
the scheduler until every node has finished, and exits. Nothing of the command after that
import ever runs, and nothing of MXNet's Python package is used: the scheduler is ps-lite's,
inside libmxnet. Importing the package registers every operator in Python, about 2 s of one
core, at the moment every other process of the job imports it too. This module makes the
same two calls of MXNet's C API (MXKVStoreCreate('dist'), MXKVStoreRunServer) on the library
alone, which loads in a tenth of a second.

    python odsgd/cluster/ps_scheduler.py --job 'python train.py ...'    # as odsgd.launch runs it

with the DMLC_* variables the tracker sets; `--job` names the training command it stands in
for, so that `ps` shows which job a scheduler belongs to (it is not run).
"""
import ctypes
import importlib.util
import os
import sys

#: MXKVStoreRunServer's controller type (mxnet/kvstore/kvstore_server.py); the scheduler
#: receives no command, so the controller is never called.
_CONTROLLER = ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p)


def mxnet_package_file(*parts, who="odsgd.cluster.ps_scheduler"):
    """Path of a file of the installed mxnet package, found without importing it (the
    import is what this module and odsgd.launch avoid); SystemExit naming `who` when mxnet
    or the file is missing."""
    spec = importlib.util.find_spec("mxnet")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("%s: mxnet is not installed in this Python (%s); run `make install`"
                         % (who, sys.executable))
    path = os.path.join(list(spec.submodule_search_locations)[0], *parts)
    if not os.path.isfile(path):
        raise SystemExit("%s: %s is missing from the mxnet package" % (who, path))
    return path


def library_path(environ=None):
    """libmxnet of the installed mxnet package (MXNET_LIBRARY_PATH first, as
    mxnet.libinfo.find_lib_path)."""
    environ = os.environ if environ is None else environ
    given = environ.get("MXNET_LIBRARY_PATH")
    if given and os.path.isfile(given):
        return given
    return mxnet_package_file("libmxnet.so")


def _check(lib, code, call):
    if code != 0:
        lib.MXGetLastError.restype = ctypes.c_char_p
        raise SystemExit("odsgd.cluster.ps_scheduler: %s failed: %s"
                         % (call, lib.MXGetLastError().decode("utf-8", "replace")))


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] != ["--job"] or len(argv) != 2:
        raise SystemExit("usage: ps_scheduler.py --job 'TRAINING COMMAND' (odsgd.launch runs "
                         "it as a job's scheduler)")
    role = os.environ.get("DMLC_ROLE")
    if role != "scheduler":
        raise SystemExit("odsgd.cluster.ps_scheduler: runs as a job's scheduler only (DMLC_ROLE is %r; "
                         "odsgd.launch starts it)" % role)
    lib = ctypes.CDLL(library_path(), ctypes.RTLD_LOCAL)
    handle = ctypes.c_void_p()
    _check(lib, lib.MXKVStoreCreate(b"dist", ctypes.byref(handle)), "MXKVStoreCreate('dist')")
    controller = _CONTROLLER(lambda command, body, _: None)
    # returns once every worker and server has finished (ps-lite's finalize barrier)
    _check(lib, lib.MXKVStoreRunServer(handle, controller, None), "MXKVStoreRunServer")
    _check(lib, lib.MXKVStoreFree(handle), "MXKVStoreFree")


if __name__ == "__main__":
    main()
