"""Compiling kvstore_ext/ into the extension library, and the CUDA compile check.

    python -m odsgd.native build [--cuda auto|on|off] [--quiet]
    python -m odsgd.native check-cuda [--nvcc PATH] [--mxnet-include DIR]

(the command line is cli.py's; `check-gpu` is gpu_check.py's, which builds its driver with
build_gpu_check_driver here: gpu_check imports this module, never the other way round).

`build` writes odsgd/lib/libodsgd_ext.so and its build record (build_info.json);
`check-cuda` compiles the CUDA kernels and links a CUDA library, and the check-gpu driver
with them, in a scratch folder without installing anything, so that a machine without a GPU
(CI) still checks that the CUDA source compiles. mxnet is imported inside the functions only
(see the package docstring).
"""
import datetime
import json
import os
import platform
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time

from .library import (BUILD_INFO_NAME, GPU_CHECK_DRIVER, LIB_DIR, LIB_NAME, SOURCE_DIR, release,
                      sources)

# Architectures a CUDA build targets when ODSGD_CUDA_ARCH is unset, kept to those the nvcc
# at hand supports: V100, T4, A100, A10/RTX 30, L4/RTX 40, H100/H200.
DEFAULT_CUDA_ARCHS = (70, 75, 80, 86, 89, 90)


# SHA-256 of the extension interface in the mxnet-cu112==1.9.1 wheel (read from the wheel, a
# zip file). Every file under mxnet/include/ and mxnet/src/ of that wheel is byte-identical
# to the CPU wheel mxnet==1.9.1 (170 files compared), so a CUDA build checked against the
# CPU wheel's headers is the build a cu112 user gets; check_cuda() verifies these two.
CU112_INTERFACE_SHA256 = {
    ("mxnet", "lib_api.h"): "9ff868aeab2ca005efe9c87e3de34fb3fbbc9e3707e1fb43e3b8ade22c522aaf",
    ("..", "src", "lib_api.cc"): "b7450f50c4b4aed6b2099552141503aa7e1d9bd4ccd9c93c5d10c06167fb4077",
}


class NativeBuildError(RuntimeError):
    """The library could not be built; the message says why and what to do."""


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


def _cuda_gencode(nvcc, archs=None):
    """nvcc -gencode flags: `archs` (e.g. [90]) when given, else $ODSGD_CUDA_ARCH ('80;90'),
    else DEFAULT_CUDA_ARCHS that this nvcc supports; SASS for each plus PTX of the newest,
    which newer GPUs JIT-compile."""
    requested = os.environ.get("ODSGD_CUDA_ARCH")
    if archs:
        archs = list(archs)
    elif requested:
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


def _nvcc_version(nvcc):
    """(major, minor) of `nvcc --version`, or None when it does not say."""
    try:
        out = subprocess.run([nvcc, "--version"], stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, universal_newlines=True).stdout
    except OSError:
        return None
    match = re.search(r"release (\d+)\.(\d+)", out)
    return (int(match.group(1)), int(match.group(2))) if match else None


def _host_compiler_flags(nvcc, verbose):
    """nvcc flags for the host compiler. $ODSGD_CUDA_HOST_CXX picks one (-ccbin), e.g. an
    older g++ that the CUDA release officially supports. CUDA before 12.0 refuses GCC 12
    and newer (Debian 12's default) with "unsupported GNU version"; the kernels use no host
    feature that changed, so -allow-unsupported-compiler is passed there instead."""
    host = os.environ.get("ODSGD_CUDA_HOST_CXX")
    if host:
        return ["-ccbin", host]
    version = _nvcc_version(nvcc)
    gcc = _first_line([os.environ.get("CXX", "g++"), "-dumpversion"]) or "0"
    if version is not None and version < (12, 0) and release(gcc)[0] >= 12:
        _say(verbose, "nvcc %d.%d predates GCC %s: passing -allow-unsupported-compiler (or set "
                      "ODSGD_CUDA_HOST_CXX=g++-11)" % (version + (gcc,)))
        return ["-allow-unsupported-compiler"]
    return []


def _mxnet_headers(include_dir=None):
    """(include folder, lib_api.cc) of the installed MXNet, or of `include_dir` (an
    extracted wheel's mxnet/include; its lib_api.cc is ../src/lib_api.cc)."""
    if include_dir is None:
        import mxnet as mx
        include_dir = os.path.join(os.path.dirname(os.path.abspath(mx.__file__)), "include")
    lib_api_cc = os.path.join(os.path.dirname(include_dir), "src", "lib_api.cc")
    for needed in (os.path.join(include_dir, "mxnet", "lib_api.h"), lib_api_cc):
        if not os.path.isfile(needed):
            raise NativeBuildError("%s is missing: this MXNet installation ships no extension "
                                   "headers; install the pip wheel (mxnet==1.9.1)" % needed)
    return include_dir, lib_api_cc


def _cxx_flags(cxx):
    flags = ["-O3", "-std=c++17", "-fPIC", "-shared", "-fopenmp", "-Wall",
             # errno is never read; without this GCC guards every sqrtf with a branch for
             # errno and the adaptive loops do not vectorise. Results are unchanged.
             "-fno-math-errno",
             # no floating-point trap is enabled in MXNet: GCC may then evaluate a division
             # on lanes whose result a select drops (Adam's recovery, adam_predict_op.cc),
             # so that loop vectorises. Results are unchanged.
             "-fno-trapping-math"]
    # x86-64-v2 (SSE4.2) runs on every x86 server of the last decade; no FMA, so results
    # round exactly as the formula reads. Other CPUs get the compiler's default target.
    if platform.machine().lower() in ("x86_64", "amd64") and _compiler_accepts(
            cxx, "-march=x86-64-v2"):
        flags.append("-march=x86-64-v2")
    return flags + shlex.split(os.environ.get("ODSGD_NATIVE_CXXFLAGS", ""))


def _find_cxx():
    cxx = os.environ.get("CXX", "g++")
    if shutil.which(cxx) is None:
        raise NativeBuildError("C++ compiler %r not found; install g++ (or set CXX)" % cxx)
    return cxx


def _compile_cuda(nvcc, scratch, verbose, archs=None, with_driver=False):
    """Compiles the library's kvstore_ext/*.cu (and with `with_driver` the check-gpu driver,
    last) into `scratch`; returns (objects, the last library source's command,
    architectures, link flags)."""
    gencode, archs = _cuda_gencode(nvcc, archs)
    host = _host_compiler_flags(nvcc, verbose)
    objects, library_command = [], None
    driver = [os.path.join(SOURCE_DIR, GPU_CHECK_DRIVER)] if with_driver else []
    for src in sources(".cu") + driver:
        obj = os.path.join(scratch, os.path.basename(src) + ".o")
        command = ([nvcc, "-c", "-O3", "-std=c++17", "-Xcompiler", "-fPIC", "-DODSGD_WITH_CUDA"]
                   + host + gencode + shlex.split(os.environ.get("ODSGD_NVCC_FLAGS", ""))
                   + [src, "-o", obj])
        _run(command, verbose, "nvcc")
        objects.append(obj)
        library_command = library_command if src in driver else command
    # The CUDA runtime is linked statically, so the library does not depend on which
    # libcudart (if any) the MXNet wheel found.
    link = ["-L", _cuda_library_dir(nvcc), "-lcudart_static", "-ldl", "-lrt", "-lpthread"]
    return objects, library_command, archs, link


def _link_driver(cxx, objects, folder, link, verbose):
    """Links the check-gpu driver (objects from _compile_cuda(..., with_driver=True)) into
    the executable `folder`/odsgd_gpu_check; returns its path."""
    output = os.path.join(folder, "odsgd_gpu_check")
    _run([cxx] + objects + ["-o", output] + link, verbose, "link driver")
    return output


def build_gpu_check_driver(nvcc, folder, archs=None, verbose=True):
    """Compiles the CUDA kernels and kvstore_ext/gpu_check_driver.cu into the standalone
    executable `folder`/odsgd_gpu_check (no MXNet needed; `archs` as in _cuda_gencode);
    returns (path, architectures). NativeBuildError on a compile or link error."""
    objects, _, archs, link = _compile_cuda(nvcc, folder, verbose, archs, with_driver=True)
    return _link_driver(_find_cxx(), objects, folder, link, verbose), archs


def _link_command(cxx, flags, include_dir, lib_api_cc, objects, output, link):
    includes = ["-I", include_dir, "-I", os.path.join(include_dir, "mxnet")]
    return ([cxx] + flags + includes + sources(".cc") + [lib_api_cc] + objects
            + ["-o", output, "-Wl,--no-undefined"] + link)


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

    _say(verbose, "building against MXNet %s (%s)"
         % (mx.__version__, os.path.dirname(os.path.abspath(mx.__file__))))
    if release(mx.__version__)[:2] != (1, 9):
        raise NativeBuildError("MXNet %s is installed; the extension library targets the 1.9 "
                               "series (install mxnet==1.9.1)" % mx.__version__)
    include_dir, lib_api_cc = _mxnet_headers()
    if not sources(".cc"):
        raise NativeBuildError("no C++ sources in %s: build from a source checkout "
                               "(pip install -e .)" % SOURCE_DIR)
    cxx = _find_cxx()
    flags = _cxx_flags(cxx)

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
                objects, cuda_command, cuda_archs, link = _compile_cuda(nvcc, scratch, verbose)
                flags.append("-DODSGD_WITH_CUDA")
            command = _link_command(cxx, flags, include_dir, lib_api_cc, objects, partial, link)
            _run(command, verbose, "compile")
        os.replace(partial, lib_path)
    finally:
        if os.path.exists(partial):
            os.remove(partial)

    lib_api_h = os.path.join(include_dir, "mxnet", "lib_api.h")
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


def check_cuda(nvcc=None, include_dir=None, verbose=True):
    """Compiles the CUDA kernels and links a complete CUDA library (the .cc files with
    -DODSGD_WITH_CUDA, lib_api.cc, the static CUDA runtime), and the check-gpu driver with
    the same kernels, in a scratch folder, then deletes it: installs nothing, needs no GPU
    and no CUDA build of MXNet.

    Parameters
    ----------
    nvcc : str, optional
        The nvcc to use; default `nvcc` on PATH.
    include_dir : str, optional
        An MXNet include folder (e.g. mxnet/include of an extracted mxnet-cu112 wheel);
        default the installed MXNet's.

    Returns
    -------
    dict
        nvcc version line, architectures, the commands, seconds taken.

    Raises
    ------
    NativeBuildError
        nvcc missing, or any compile or link error (its output is printed above).
    """
    started = time.time()
    nvcc = nvcc or shutil.which("nvcc")
    if nvcc is None or shutil.which(nvcc) is None:
        raise NativeBuildError("nvcc not found (%s); put it on PATH or pass --nvcc, e.g. the "
                               "one `make cuda-check` installs" % (nvcc or "not on PATH"))
    if not sources(".cu"):
        raise NativeBuildError("no CUDA sources in %s" % SOURCE_DIR)
    given_include = include_dir is not None
    include_dir, lib_api_cc = _mxnet_headers(include_dir)
    if not given_include:
        _check_cu112_interface(include_dir)
    cxx = _find_cxx()
    version = _nvcc_version(nvcc)
    _say(verbose, "checking the CUDA kernels with nvcc %s (%s)"
         % ("%d.%d" % version if version else "?", nvcc))
    with tempfile.TemporaryDirectory(prefix="odsgd-cuda-check-") as scratch:
        objects, cuda_command, archs, link = _compile_cuda(nvcc, scratch, verbose,
                                                           with_driver=True)
        # -O0: the check is for compile and link errors; optimising would triple its time.
        command = _link_command(cxx, _cxx_flags(cxx) + ["-DODSGD_WITH_CUDA", "-O0"], include_dir,
                                lib_api_cc, objects[:-1], os.path.join(scratch, LIB_NAME), link)
        _run(command, verbose, "link")
        _link_driver(cxx, objects, scratch, link, verbose)
    seconds = time.time() - started
    _say(verbose, "CUDA kernels and the check-gpu driver compile and link (sm_%s) in %.1f s"
         % (", sm_".join(str(a) for a in archs), seconds))
    return {"nvcc": "%d.%d" % version if version else None, "archs": archs,
            "cuda_command": shlex.join(cuda_command), "link_command": shlex.join(command),
            "seconds": seconds}


def _check_cu112_interface(include_dir):
    """NativeBuildError unless the headers at `include_dir` are mxnet-cu112 1.9.1's."""
    import hashlib
    for parts, expected in CU112_INTERFACE_SHA256.items():
        path = os.path.normpath(os.path.join(include_dir, *parts))
        with open(path, "rb") as handle:
            digest = hashlib.sha256(handle.read()).hexdigest()
        if digest != expected:
            raise NativeBuildError("%s differs from the one in mxnet-cu112==1.9.1 (sha256 %s); "
                                   "pass --mxnet-include with the include folder of the CUDA "
                                   "wheel you target" % (path, digest))

