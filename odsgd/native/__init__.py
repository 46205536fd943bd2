"""The fused C++ operators of kvstore_ext/: build, load, and call them.

    python -m odsgd.native build      # or `make native`: compiles odsgd/lib/libodsgd_ext.so

The library is an MXNet extension library (MXNet's ``include/mxnet/lib_api.h``), compiled
against the headers and ``src/lib_api.cc`` of the MXNet wheel installed in the same
environment and loaded with ``mx.library.load``. It registers two operators,
``mx.nd.odsgd_local_update`` and ``mx.nd.odsgd_predict_update``: the OD-phase local steps of
SPEC.md section 2 ('sgd' and 'predict'), each one pass over memory that updates the weight and
its states in place. `local_update_` and `predict_update_` below are their Python faces.

`load()` runs at ``import odsgd`` on worker processes. Without the library it logs one
warning and returns False, and odsgd.local_update uses its NDArray fallback; a library built
for another MXNet version raises ImportError naming the rebuild command.

Environment: ``ODSGD_NATIVE_LIB`` loads the library from another path (its build_info.json
must sit beside it); ``ODSGD_NATIVE_CXXFLAGS`` adds compiler flags to a build (e.g.
``-march=native``); ``ODSGD_CUDA_ARCH`` picks the GPU architectures of a CUDA build
(e.g. ``80;90``); ``CXX`` picks the C++ compiler (default g++).

Nothing here imports mxnet at module level: on parameter servers ``import mxnet`` does not
return (the server loop starts inside it), and this module must stay importable there.
"""
import argparse
import datetime
import json
import logging
import os
import platform
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
import time

LOG = logging.getLogger("odsgd")

# odsgd/native/ is a package (not a module) so that `python -m odsgd.native` runs
# __main__.py: `import odsgd` has already imported odsgd.native by then, and runpy warns when
# the module it is asked to run is already imported.
PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SOURCE_DIR = os.path.join(os.path.dirname(PACKAGE_DIR), "kvstore_ext")
LIB_DIR = os.path.join(PACKAGE_DIR, "lib")
LIB_NAME = "libodsgd_ext.so"
BUILD_INFO_NAME = "build_info.json"
REBUILD_HINT = "rebuild it with `make native` or `python -m odsgd.native build`"
OP_NAMES = ("odsgd_local_update", "odsgd_predict_update")

# Architectures a CUDA build targets when ODSGD_CUDA_ARCH is unset, kept to those the nvcc
# at hand supports: V100, T4, A100, A10/RTX 30, L4/RTX 40, H100/H200.
DEFAULT_CUDA_ARCHS = (70, 75, 80, 86, 89, 90)

_lock = threading.Lock()
_loaded_path = None        # absolute path of the library once mx.library.load succeeded
_build_info = None         # its build_info.json, as a dict
_ops = {}                  # operator name -> mx.nd function
_warned = set()            # warnings already logged (each at most once per process)
_placeholders = {}         # mx.Context -> 1-element float32 array standing in for an unused var


class NativeBuildError(RuntimeError):
    """The library could not be built; the message says why and what to do."""


# ------------------------------------------------------------------------------------------
# Paths and versions

def library_path():
    """Absolute path of the library `load()` uses: $ODSGD_NATIVE_LIB, else odsgd/lib/."""
    return os.path.abspath(os.environ.get("ODSGD_NATIVE_LIB") or os.path.join(LIB_DIR, LIB_NAME))


def _release(version):
    """(major, minor, patch) of a version string such as '1.9.1' or '1.9.1.post0', so that
    versions compare as numbers ('1.10' > '1.9'), never as strings."""
    match = re.match(r"\s*(\d+)(?:\.(\d+))?(?:\.(\d+))?", str(version))
    if not match:
        raise ValueError("cannot parse version %r" % (version,))
    return tuple(int(part or 0) for part in match.groups())


def _format_release(release):
    return ".".join(str(part) for part in release)


def _read_build_info(lib_path):
    """build_info.json beside `lib_path`, as a dict; ImportError when absent or unreadable."""
    info_path = os.path.join(os.path.dirname(lib_path), BUILD_INFO_NAME)
    try:
        with open(info_path) as handle:
            info = json.load(handle)
        _release(info["mxnet_version"])
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise ImportError("odsgd: %s has no valid build record (%s: %s); %s"
                          % (lib_path, info_path, err, REBUILD_HINT)) from err
    return info


def _invoked_as_build_command():
    """True in `python -m odsgd.native ...`: `import odsgd` runs load() before this module's
    main(), and a stale or missing library must not stop the command that rebuilds it.
    (sys.orig_argv exists from Python 3.10; older versions just load as usual.)"""
    argv = list(getattr(sys, "orig_argv", []))
    return any(a == "-m" and b == "odsgd.native" for a, b in zip(argv, argv[1:]))


def _mxnet_error_reason(err):
    """The informative part of an MXNetError: the lines after its C++ traceback header."""
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    reason = [line for line in lines
              if not line.startswith(("Traceback (most recent", "File \""))]
    return " ".join(reason) or str(err)


def _warn_once(key, message, *args):
    if key not in _warned:
        _warned.add(key)
        LOG.warning(message, *args)


# ------------------------------------------------------------------------------------------
# Loading

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
        True when mx.nd.odsgd_local_update and mx.nd.odsgd_predict_update exist (now or from
        an earlier call: MXNet cannot unload a library, so the first success stays). False
        when the file is missing: one warning (logger "odsgd") says that the NDArray fallback
        is used and how to build. Also False, silently, inside `python -m odsgd.native`.

    Raises
    ------
    ImportError
        The library was built against another MXNet version, has no build record, or MXNet
        refused it; the message names the command that rebuilds it.
    """
    global _loaded_path, _build_info
    with _lock:
        if _loaded_path is not None:
            return True
        if path is None and _invoked_as_build_command():
            return False
        lib_path = os.path.abspath(path) if path else library_path()
        if not os.path.isfile(lib_path):
            _warn_once(("missing", lib_path),
                       "odsgd: native library %s not found; the local update uses the NDArray "
                       "fallback (several passes over memory instead of one). Build it with "
                       "`make native` or `python -m odsgd.native build`.", lib_path)
            return False
        info = _read_build_info(lib_path)

        import mxnet as mx
        from mxnet import library as mx_library

        built, running = _release(info["mxnet_version"]), _release(mx.__version__)
        if built != running:
            raise ImportError("odsgd: %s was built against MXNet %s but MXNet %s is installed; %s"
                              % (lib_path, _format_release(built), _format_release(running),
                                 REBUILD_HINT))
        try:
            mx_library.load(lib_path, verbose=False)
        except mx.base.MXNetError as err:
            raise ImportError("odsgd: MXNet could not load %s (%s); %s"
                              % (lib_path, _mxnet_error_reason(err), REBUILD_HINT)) from err
        missing = [name for name in OP_NAMES if not hasattr(mx.nd, name)]
        if missing:
            raise ImportError("odsgd: %s registered no operator %s; %s"
                              % (lib_path, ", ".join(missing), REBUILD_HINT))
        _ops.update((name, getattr(mx.nd, name)) for name in OP_NAMES)
        _loaded_path, _build_info = lib_path, info
        if mx.runtime.Features().is_enabled("CUDA") and not info.get("cuda_compiled"):
            _warn_once("no-cuda", "odsgd: %s has no CUDA kernels (built without nvcc or "
                       "against a CPU MXNet); GPU arrays use the NDArray fallback. With nvcc on "
                       "PATH, %s.", lib_path, REBUILD_HINT)
        return True


def is_loaded():
    """True once `load()` has succeeded in this process."""
    return _loaded_path is not None


def build_info():
    """The loaded library's build record (dict: mxnet_version, cuda_compiled, compiler
    command, ...), or None when no library is loaded."""
    return dict(_build_info) if _build_info is not None else None


def supports(context):
    """True when the fused operators can run on arrays of `context` (an mx.Context): the
    library is loaded, and for GPU contexts it was compiled with its CUDA kernels."""
    if not is_loaded():
        return False
    return context.device_type == "cpu" or bool(_build_info.get("cuda_compiled"))


# ------------------------------------------------------------------------------------------
# Operator wrappers

def _operator(name):
    try:
        return _ops[name]
    except KeyError:
        raise RuntimeError("odsgd: the native library is not loaded (odsgd.native.load() "
                           "returned False or was not called); build it with `make native` or "
                           "`python -m odsgd.native build`") from None


def _var_argument(var, weight, adaptive, caller):
    """var as the operator takes it: the caller's array, or when the step is not adaptive and
    var is None, a shared 1-element placeholder of weight's context. The operator neither
    reads nor declares it written then, so sharing it creates no dependency between keys."""
    if var is not None:
        return var
    if adaptive:
        raise TypeError("odsgd.native.%s: var is required when adaptive is true (an array of "
                        "the weight's shape holding v)" % caller)
    context = weight.context
    placeholder = _placeholders.get(context)
    if placeholder is None:
        import mxnet as mx
        placeholder = mx.nd.zeros((1,), ctx=context, dtype="float32")
        _placeholders[context] = placeholder
    return placeholder


def _attributes(rescale_grad, clip_gradient, lr, momentum, wd, lam, adaptive, beta, eps):
    # repr() of a Python float round-trips exactly, so the operator's float32 constants equal
    # np.float32(x) of the same values.
    def number(x):
        return repr(float(x))
    return dict(rescale_grad=number(rescale_grad),
                clip_gradient=number(clip_gradient if clip_gradient is not None else -1.0),
                lr=number(lr), momentum=number(momentum), wd=number(wd), lam=number(lam),
                adaptive="1" if adaptive else "0", beta=number(beta), eps=number(eps))


def local_update_(weight, grad, global_weight, mom, var, *, rescale_grad, clip_gradient, lr,
                  momentum, wd, lam, adaptive, beta, eps):
    """The local SGD step of OD-SGD (SPEC.md section 2), fused, in place.

    Per element, in float32, in one pass over memory::

        g    = clip(rescale_grad * grad, -clip_gradient, clip_gradient)   # clip if > 0
        v    = beta * v + (1 - beta) * g * g;  c = 1 / sqrt(v + eps)      # adaptive
        c    = 1                                                          # otherwise
        step = g + wd * W + lam * c * g * g * (W - w)
        mom  = momentum * mom - lr * step
        w    = W + mom

    Parameters
    ----------
    weight : NDArray, float32, any shape S
        w_t on entry, w_{t+1} on return (updated in place: the operator writes out=weight).
    grad : NDArray, float32, shape S
        The worker's raw gradient grad_t (before rescale_grad).
    global_weight : NDArray, float32, shape S
        W_t, the newest global weights the worker holds. Read only.
    mom : NDArray, float32, shape S
        The worker's momentum m for this key (starts at 0); updated in place.
    var : NDArray, float32, shape S, or None
        The adaptive mode's v (starts at 0); updated in place when `adaptive`. When not
        adaptive it is never touched: None (or any float32 array) will do.
    rescale_grad : float
        r, multiplies grad (what Trainer.step(batch_size) sets: 1 / batch_size).
    clip_gradient : float or None
        Bound of the rescaled gradient; None or <= 0 turns clipping off.
    lr, momentum, wd : float
        The local optimizer's learning rate (after its schedule), momentum mu_l, weight decay.
    lam : float
        Compensation strength; 0 turns the compensation term off.
    adaptive : bool
        True: c = 1 / sqrt(v + eps) ('adaptive' mode); False: c = 1 ('constant').
    beta, eps : float
        Decay of v and the term added under the square root (read only when adaptive).

    Returns
    -------
    NDArray
        `weight` itself.

    All arrays share one context and must not overlap in memory (global_weight may be any
    read-only array). Raises MXNetError for other dtypes or shapes; requires `load()`.
    """
    _operator("odsgd_local_update")(
        weight, grad, global_weight, mom, _var_argument(var, weight, adaptive, "local_update_"),
        out=weight, **_attributes(rescale_grad, clip_gradient, lr, momentum, wd, lam, adaptive,
                                  beta, eps))
    return weight


def predict_update_(weight, grad, global_weight, prev_global_weight, var, *, rescale_grad,
                    clip_gradient, lr, momentum, wd, lam, adaptive, beta, eps, num_workers):
    """The 'predict' local step of OD-SGD (SPEC.md section 2), fused, in place.

    Predicts the global SGD update that has not arrived yet. Per element, in float32::

        g, c as in `local_update_` (v updated first when adaptive)
        gc = g + lam * c * g * g * (W - w)
        w  = W + momentum * (W - W_prev) - lr * (num_workers * gc + wd * W)

    Parameters
    ----------
    weight : NDArray, float32, any shape S
        w_t on entry, w_{t+1} on return (updated in place).
    grad : NDArray, float32, shape S
        The worker's raw gradient grad_t.
    global_weight : NDArray, float32, shape S
        W_t, the newest global weights. Read only.
    prev_global_weight : NDArray, float32, shape S
        W_{t-1}; pass global_weight itself when no earlier global weights exist. Read only.
    var : NDArray, float32, shape S, or None
        v of the adaptive mode, updated in place when `adaptive`; None allowed otherwise.
    rescale_grad, clip_gradient, lam, adaptive, beta, eps
        As in `local_update_`.
    lr, momentum, wd : float
        The *global* optimizer's (SGD) current learning rate, momentum mu and weight decay.
    num_workers : int
        N, the number of workers whose gradients the global update sums.

    Returns
    -------
    NDArray
        `weight` itself.
    """
    attributes = _attributes(rescale_grad, clip_gradient, lr, momentum, wd, lam, adaptive, beta,
                             eps)
    attributes["num_workers"] = str(int(num_workers))
    _operator("odsgd_predict_update")(
        weight, grad, global_weight, prev_global_weight,
        _var_argument(var, weight, adaptive, "predict_update_"), out=weight, **attributes)
    return weight


# ------------------------------------------------------------------------------------------
# Building

def _say(verbose, message):
    if verbose:
        print("odsgd.native: " + message, flush=True)


def _relative(path):
    """`path` relative to the working directory when below it (for readable progress)."""
    rel = os.path.relpath(path)
    return path if rel.startswith("..") else rel


def _run(command, verbose, what):
    """Runs a compiler command; shows its output when verbose or on failure."""
    _say(verbose, "%s: %s" % (what, shlex.join(command)))
    result = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            universal_newlines=True)
    if result.stdout and (verbose or result.returncode):
        sys.stderr.write(result.stdout)
    if result.returncode:
        raise NativeBuildError("%s failed with exit status %d (command above)"
                               % (what, result.returncode))


def _compiler_accepts(cxx, flag):
    """True when `cxx` accepts `flag` (older GCCs do not know -march=x86-64-v2)."""
    probe = subprocess.run([cxx, flag, "-x", "c++", "-E", "-o", os.devnull, os.devnull],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return probe.returncode == 0


def _first_line(command):
    try:
        out = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             universal_newlines=True).stdout
    except OSError:
        return None
    return out.strip().splitlines()[0] if out.strip() else None


def _cuda_gencode(nvcc):
    """nvcc -gencode flags: $ODSGD_CUDA_ARCH ('80;90'), else DEFAULT_CUDA_ARCHS that this
    nvcc supports; SASS for each plus PTX of the newest, which newer GPUs JIT-compile."""
    requested = os.environ.get("ODSGD_CUDA_ARCH")
    if requested:
        archs = [int(a) for a in re.split(r"[;,\s]+", requested.strip()) if a]
    else:
        listed = subprocess.run([nvcc, "--list-gpu-arch"], stdout=subprocess.PIPE,
                                stderr=subprocess.DEVNULL, universal_newlines=True)
        supported = {int(m) for m in re.findall(r"compute_(\d+)", listed.stdout)}
        # nvcc before 11.0 has no --list-gpu-arch; Volta to Ampere are safe guesses there.
        archs = [a for a in DEFAULT_CUDA_ARCHS if a in supported] if supported else [70, 75, 80]
    if not archs:
        raise NativeBuildError("no CUDA architecture to build for; set ODSGD_CUDA_ARCH, e.g. 90")
    flags = []
    for arch in archs:
        flags += ["-gencode", "arch=compute_%d,code=sm_%d" % (arch, arch)]
    flags += ["-gencode", "arch=compute_%d,code=compute_%d" % (archs[-1], archs[-1])]
    return flags, archs


def _cuda_library_dir(nvcc):
    """The folder of libcudart_static.a: under $CUDA_HOME or $CUDA_PATH when set, else the
    toolkit nvcc sits in, else the conventional /usr/local/cuda (nvcc may be a wrapper)."""
    homes = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"),
             os.path.dirname(os.path.dirname(os.path.realpath(nvcc))), "/usr/local/cuda"]
    homes = [home for home in homes if home]
    for home in homes:
        for sub in ("lib64", os.path.join("targets", "x86_64-linux", "lib"), "lib"):
            candidate = os.path.join(home, sub)
            if os.path.exists(os.path.join(candidate, "libcudart_static.a")):
                return candidate
    raise NativeBuildError("libcudart_static.a not found under %s; set CUDA_HOME to the CUDA "
                           "toolkit that holds nvcc" % " or ".join(homes))


def build(cuda="auto", verbose=True):
    """Compiles kvstore_ext/ into odsgd/lib/libodsgd_ext.so against the installed MXNet.

    Parameters
    ----------
    cuda : {'auto', 'on', 'off'}
        'auto' compiles the CUDA kernels when nvcc is on PATH and the installed MXNet is a
        CUDA build, and skips them with a one-line message otherwise; 'on' requires nvcc
        (even with a CPU MXNet, to check that the CUDA source compiles); 'off' never.
    verbose : bool
        Print progress and compiler output (compiler output is shown on failure regardless).

    Returns
    -------
    str
        Absolute path of the library. odsgd/lib/build_info.json records the MXNet version
        built against, the compiler commands, and whether CUDA was compiled.

    Raises
    ------
    NativeBuildError
        With the reason (no compiler, MXNet without headers, compiler errors, ...).
    """
    if cuda not in ("auto", "on", "off"):
        raise ValueError("cuda must be 'auto', 'on' or 'off', got %r" % (cuda,))
    started = time.time()
    import mxnet as mx

    mx_dir = os.path.dirname(os.path.abspath(mx.__file__))
    include_dir = os.path.join(mx_dir, "include")
    lib_api_cc = os.path.join(mx_dir, "src", "lib_api.cc")
    lib_api_h = os.path.join(include_dir, "mxnet", "lib_api.h")
    release = _release(mx.__version__)
    _say(verbose, "building against MXNet %s (%s)" % (mx.__version__, mx_dir))
    if release[:2] != (1, 9):
        raise NativeBuildError("MXNet %s is installed; the extension library targets the 1.9 "
                               "series (install mxnet==1.9.1)" % mx.__version__)
    for needed in (lib_api_h, lib_api_cc):
        if not os.path.isfile(needed):
            raise NativeBuildError("%s is missing: this MXNet installation ships no extension "
                                   "headers; install the pip wheel (mxnet==1.9.1)" % needed)
    sources = sorted(os.path.join(SOURCE_DIR, name) for name in os.listdir(SOURCE_DIR)
                     if name.endswith(".cc")) if os.path.isdir(SOURCE_DIR) else []
    cuda_sources = sorted(os.path.join(SOURCE_DIR, name) for name in os.listdir(SOURCE_DIR)
                          if name.endswith(".cu")) if sources else []
    if not sources:
        raise NativeBuildError("no C++ sources in %s: build from a source checkout "
                               "(pip install -e .)" % SOURCE_DIR)

    cxx = os.environ.get("CXX", "g++")
    if shutil.which(cxx) is None:
        raise NativeBuildError("C++ compiler %r not found; install g++ (or set CXX)" % cxx)
    flags = ["-O3", "-std=c++17", "-fPIC", "-shared", "-fopenmp", "-Wall",
             # errno is never read; without this GCC guards every sqrtf with a branch for
             # errno and the adaptive loops do not vectorise. Results are unchanged.
             "-fno-math-errno"]
    # x86-64-v2 (SSE4.2) runs on every x86 server of the last decade; no FMA, so results
    # round exactly as the formula reads. Other CPUs get the compiler's default target.
    if platform.machine().lower() in ("x86_64", "amd64") and _compiler_accepts(
            cxx, "-march=x86-64-v2"):
        flags.append("-march=x86-64-v2")
    flags += shlex.split(os.environ.get("ODSGD_NATIVE_CXXFLAGS", ""))
    includes = ["-I", include_dir, "-I", os.path.join(include_dir, "mxnet")]

    mx_cuda = mx.runtime.Features().is_enabled("CUDA")
    nvcc = shutil.which("nvcc")
    with_cuda = False
    if cuda == "on":
        if nvcc is None:
            raise NativeBuildError("--cuda on, but nvcc is not on PATH")
        with_cuda = True
        if not mx_cuda:
            _say(verbose, "note: MXNet is a CPU build; the CUDA kernels are compiled but "
                          "cannot run")
    elif cuda == "auto":
        if not mx_cuda:
            _say(verbose, "CUDA kernels: skipped (the installed MXNet is a CPU build)")
        elif nvcc is None:
            _say(verbose, "CUDA kernels: skipped (nvcc is not on PATH)")
        else:
            with_cuda = True
    else:
        _say(verbose, "CUDA kernels: skipped (--cuda off)")

    os.makedirs(LIB_DIR, exist_ok=True)
    lib_path = os.path.join(LIB_DIR, LIB_NAME)
    # Written under another name and renamed: a running process that has the old library
    # mapped must never see a half-written file.
    partial = os.path.join(LIB_DIR, ".%s.%d.partial.so" % (LIB_NAME, os.getpid()))
    cuda_command, cuda_archs = None, None
    try:
        with tempfile.TemporaryDirectory(prefix="odsgd-native-") as scratch:
            objects, link = [], []
            if with_cuda:
                gencode, cuda_archs = _cuda_gencode(nvcc)
                for src in cuda_sources:
                    obj = os.path.join(scratch, os.path.basename(src) + ".o")
                    cuda_command = ([nvcc, "-c", "-O3", "-std=c++17", "-Xcompiler", "-fPIC",
                                     "-DODSGD_WITH_CUDA"] + gencode + [src, "-o", obj])
                    _run(cuda_command, verbose, "nvcc")
                    objects.append(obj)
                # The CUDA runtime is linked statically, so the library does not depend on
                # which libcudart (if any) the MXNet wheel found.
                link = ["-L", _cuda_library_dir(nvcc), "-lcudart_static", "-ldl", "-lrt",
                        "-lpthread"]
                flags.append("-DODSGD_WITH_CUDA")
            command = ([cxx] + flags + includes + sources + [lib_api_cc] + objects
                       + ["-o", partial, "-Wl,--no-undefined"] + link)
            _run(command, verbose, "compile")
        os.replace(partial, lib_path)
    finally:
        if os.path.exists(partial):
            os.remove(partial)

    api_version = re.search(r"#define\s+MX_LIBRARY_VERSION\s+(\d+)", open(lib_api_h).read())
    info = {
        "mxnet_version": mx.__version__,
        "mxnet_cuda": bool(mx_cuda),
        "lib_api_version": int(api_version.group(1)) if api_version else None,
        "cuda_compiled": with_cuda,
        "cuda_archs": cuda_archs,
        "compiler": _first_line([cxx, "--version"]),
        "compiler_command": shlex.join(lib_path if part == partial else part
                                       for part in command),
        "cuda_command": shlex.join(cuda_command) if cuda_command else None,
        "built_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "library": LIB_NAME,
    }
    info_path = os.path.join(LIB_DIR, BUILD_INFO_NAME)
    with open(info_path + ".partial", "w") as handle:
        json.dump(info, handle, indent=2)
        handle.write("\n")
    os.replace(info_path + ".partial", info_path)
    _say(verbose, "wrote %s (%d KiB) and %s in %.1f s"
         % (_relative(lib_path), os.path.getsize(lib_path) // 1024, _relative(info_path),
            time.time() - started))
    return lib_path


def main(argv=None):
    """`python -m odsgd.native build [--cuda auto|on|off] [--quiet]`; returns the exit status."""
    parser = argparse.ArgumentParser(prog="python -m odsgd.native",
                                     description="Build the fused OD-SGD operators "
                                                 "(kvstore_ext/) against the installed MXNet.")
    commands = parser.add_subparsers(dest="command", required=True)
    build_parser = commands.add_parser("build", help="compile odsgd/lib/libodsgd_ext.so")
    build_parser.add_argument("--cuda", choices=("auto", "on", "off"), default="auto",
                              help="compile the CUDA kernels: auto (when nvcc is on PATH and "
                                   "MXNet is a CUDA build), on, off (default: auto)")
    build_parser.add_argument("--quiet", action="store_true", help="print errors only")
    args = parser.parse_args(argv)
    try:
        build(cuda=args.cuda, verbose=not args.quiet)
    except NativeBuildError as err:
        print("odsgd.native: build failed: %s" % err, file=sys.stderr)
        return 1
    return 0

