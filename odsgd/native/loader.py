"""Loading the extension library into MXNet, once per process, and what got loaded.

The one place that holds the library's state: `load()` fills it, `is_loaded()`,
`loaded_path()`, `build_info()`, `supports()` and `operator()` read it. mxnet is imported
inside load() only (see the package docstring)."""
import logging
import os
import sys
import threading

from .library import (OP_NAMES, REBUILD_HINT, format_release, library_path, read_build_info,
                      release)

LOG = logging.getLogger("odsgd")

_lock = threading.Lock()
_loaded_path = None        # absolute path of the library once mx.library.load succeeded
_build_info = None         # its build_info.json, as a dict
_ops = {}                  # operator name -> mx.nd function
_warned = set()            # warnings already logged (each at most once per process)


def warn_once(key, message, *args):
    """Logs `message` on the "odsgd" logger the first time `key` is seen in this process."""
    if key not in _warned:
        _warned.add(key)
        LOG.warning(message, *args)


def _invoked_as_build_command():
    """True in `python -m odsgd.native ...`: `import odsgd` runs load() before this package's
    main(), and a stale or missing library must not stop the command that rebuilds it.
    (sys.orig_argv exists from Python 3.10; older versions just load as usual.)"""
    argv = list(getattr(sys, "orig_argv", []))
    return any(a == "-m" and b == "odsgd.native" for a, b in zip(argv, argv[1:]))


def mxnet_error_reason(err):
    """The informative part of an MXNetError: the lines after its C++ traceback header."""
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    reason = [line for line in lines
              if not line.startswith(("Traceback (most recent", "File \""))]
    return " ".join(reason) or str(err)


def load(path=None):
    """Loads the fused operators into MXNet; returns True when they are available.

    Parameters
    ----------
    path : str, optional
        The library file; default `library_path()` ($ODSGD_NATIVE_LIB or
        odsgd/lib/libodsgd_ext.so). Its build_info.json must sit in the same folder.

    Returns
    -------
    bool
        True when every operator of library.OP_NAMES exists as mx.nd.<name> (now or from an
        earlier call: MXNet cannot unload a library, so the first success stays). False
        when the file is missing: one warning (logger "odsgd") says that the NDArray fallback
        is used and how to build. Also False, silently, inside `python -m odsgd.native`.

    Raises
    ------
    ImportError
        The library was built against another MXNet version, has no build record, lacks an
        operator, or MXNet refused it; the message names the command that rebuilds it.
    """
    global _loaded_path, _build_info
    with _lock:
        if _loaded_path is not None:
            return True
        if path is None and _invoked_as_build_command():
            return False
        lib_path = os.path.abspath(path) if path else library_path()
        if not os.path.isfile(lib_path):
            warn_once(("missing", lib_path),
                      "odsgd: native library %s not found; the local update uses the NDArray "
                      "fallback (several passes over memory instead of one). Build it with "
                      "`make native` or `python -m odsgd.native build`.", lib_path)
            return False
        info = read_build_info(lib_path)

        import mxnet as mx

        built, running = release(info["mxnet_version"]), release(mx.__version__)
        if built != running:
            raise ImportError("odsgd: %s was built against MXNet %s but MXNet %s is installed; %s"
                              % (lib_path, format_release(built), format_release(running),
                                 REBUILD_HINT))
        try:
            _load_library(lib_path)
        except mx.base.MXNetError as err:
            raise ImportError("odsgd: MXNet could not load %s (%s); %s"
                              % (lib_path, mxnet_error_reason(err), REBUILD_HINT)) from err
        missing = [name for name in OP_NAMES if not hasattr(mx.nd, name)]
        if missing:
            raise ImportError("odsgd: %s registered no operator %s; %s"
                              % (lib_path, ", ".join(missing), REBUILD_HINT))
        _ops.update((name, getattr(mx.nd, name)) for name in OP_NAMES)
        _loaded_path, _build_info = lib_path, info
        if mx.runtime.Features().is_enabled("CUDA") and not info.get("cuda_compiled"):
            warn_once("no-cuda", "odsgd: %s has no CUDA kernels (built without nvcc or "
                      "against a CPU MXNet); GPU arrays use the NDArray fallback. With nvcc on "
                      "PATH, %s.", lib_path, REBUILD_HINT)
        return True


def _operator_names(mx):
    import ctypes
    size, names = ctypes.c_uint(), ctypes.POINTER(ctypes.c_char_p)()
    mx.base.check_call(mx.base._LIB.MXListAllOpNames(ctypes.byref(size), ctypes.byref(names)))
    return {mx.base.py_str(names[i]) for i in range(size.value)}


def _load_library(lib_path):
    """mx.library.load without its cost: MXNet's own call regenerates the Python function of
    every operator it has (about 950, a second of CPU in every worker process, at the moment
    the job's other processes start too); this registers only the operators the library
    added, as mx.nd.<name> and mx.sym.<name> (where mx.library.load puts them)."""
    import ctypes
    import mxnet as mx
    from mxnet.ndarray.register import _make_ndarray_function
    from mxnet.symbol.register import _make_symbol_function

    before = _operator_names(mx)
    mx.base.check_call(mx.base._LIB.MXLoadLib(ctypes.c_char_p(lib_path.encode("utf-8")),
                                              mx.base.mx_uint(0)))
    for name in sorted(_operator_names(mx) - before):
        handle = mx.base.OpHandle()
        mx.base.check_call(mx.base._LIB.NNGetOpHandle(mx.base.c_str(name),
                                                      ctypes.byref(handle)))
        for package, make in (("ndarray", _make_ndarray_function),
                              ("symbol", _make_symbol_function)):
            function = make(handle, name, name)
            function.__module__ = "mxnet.%s" % package
            for module in (sys.modules["mxnet.%s.op" % package],
                           sys.modules["mxnet.%s" % package]):
                setattr(module, name, function)
            sys.modules["mxnet.%s.op" % package].__all__.append(name)


def is_loaded():
    """True once `load()` has succeeded in this process."""
    return _loaded_path is not None


def loaded_path():
    """Absolute path of the loaded library, or None."""
    return _loaded_path


def build_info():
    """The loaded library's build record (dict: mxnet_version, cuda_compiled, compiler
    command, ...), or None when no library is loaded."""
    return dict(_build_info) if _build_info is not None else None


def supports(context):
    """True when the fused operators can run on arrays of `context` (an mx.Context): the
    library is loaded, and for GPU contexts it was compiled with its CUDA kernels."""
    if _loaded_path is None:
        return False
    return context.device_type == "cpu" or bool(_build_info.get("cuda_compiled"))


def operator(name):
    """The mx.nd function of operator `name`; RuntimeError naming the build command when the
    library is not loaded."""
    try:
        return _ops[name]
    except KeyError:
        raise RuntimeError("odsgd: the native library is not loaded (odsgd.native.load() "
                           "returned False or was not called); build it with `make native` or "
                           "`python -m odsgd.native build`") from None
