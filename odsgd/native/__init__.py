"""The fused C++ (and CUDA) operators of kvstore_ext/: build, load, and call them.

    python -m odsgd.native build         # or `make native`: compiles odsgd/lib/libodsgd_ext.so
    python -m odsgd.native check-cuda    # compiles and links the CUDA kernels, installs nothing
    python -m odsgd.native check-gpu     # runs the CUDA kernels on this machine's GPU (no MXNet)

The library is an MXNet extension library (MXNet's ``include/mxnet/lib_api.h``), compiled
against the headers and ``src/lib_api.cc`` of the MXNet wheel installed in the same
environment and loaded through MXNet's ``MXLoadLib`` (loader.py). Its operators are one
family: the OD-phase local steps of docs/spec.md, section 4 ('sgd', 'predict', and 'predict'
for NAG, Adam's recovered 'predict') on a group of arrays in one call, each one pass over
memory that updates the weights and their states in place, and the gather / scatter of arrays
to and from one flat buffer. Python faces (full
docstrings in ops.py):

    multi_update_(kind, ...)           P arrays in one operator call (per-array lr and wd)
    local_update_, predict_update_     one array: multi_update_ with P = 1
    gather_, scatter_                  arrays <-> one flat buffer, one operator call
    adam_predict_                      'predict' for a global Adam on one array (CPU)
    accepts(arrays)                    whether the operators take these arrays

`load()` runs at ``import odsgd`` on worker processes. Without the library it logs one
warning and returns False, and odsgd.worker.local_update uses its NDArray fallback; a library built
for another MXNet version raises ImportError naming the rebuild command.

Modules: library (paths, versions, build record), loader (load and the loaded state), build
(compiler driver), gpu_check (`check-gpu`: the CUDA kernels against a NumPy reference, and
their bandwidth; it builds its driver with build), cli (`python -m odsgd.native`, over build
and gpu_check), ops (call wrappers), layout (MKL-DNN layouts).

Environment: ``ODSGD_NATIVE_LIB`` loads the library from another path (its build_info.json
must sit beside it); ``ODSGD_NATIVE_CXXFLAGS`` adds compiler flags to a build (e.g.
``-march=native``); ``ODSGD_CUDA_ARCH`` picks the GPU architectures of a CUDA build
(e.g. ``80;90``); ``ODSGD_CUDA_HOST_CXX`` the host compiler nvcc uses; ``ODSGD_NVCC_FLAGS``
adds nvcc flags; ``CXX`` picks the C++ compiler (default g++).

Nothing here imports mxnet at module level: on parameter servers ``import mxnet`` does not
return (the server loop starts inside it), and this package must stay importable there.
"""
from .build import NativeBuildError, build, check_cuda  # noqa: F401
from .cli import main  # noqa: F401
from .library import library_path, release  # noqa: F401
from .loader import build_info, is_loaded, load, loaded_path, supports  # noqa: F401
from .ops import (accepts, adam_predict_, gather_, local_update_, multi_update_,  # noqa: F401
                  predict_update_, scatter_)
