"""Where the extension library lives and what its build record says (no mxnet import).

Shared by `build` (which writes the library and its record) and `loader` (which reads
them)."""
import json
import os
import re

# odsgd/native/ is a package (not a module) so that `python -m odsgd.native` runs
# __main__.py: `import odsgd` has already imported odsgd.native by then, and runpy warns when
# the module it is asked to run is already imported.
PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SOURCE_DIR = os.path.join(os.path.dirname(PACKAGE_DIR), "kvstore_ext")
LIB_DIR = os.path.join(PACKAGE_DIR, "lib")
LIB_NAME = "libodsgd_ext.so"
BUILD_INFO_NAME = "build_info.json"
#: the standalone CUDA test driver of `python -m odsgd.native check-gpu`, in kvstore_ext/
GPU_CHECK_DRIVER = "gpu_check_driver.cu"
REBUILD_HINT = "rebuild it with `make native` or `python -m odsgd.native build`"
#: every operator the library registers; load() checks that all of them appeared
OP_NAMES = ("odsgd_multi_local_update", "odsgd_multi_predict_update",
            "odsgd_multi_nag_predict_update", "odsgd_gather", "odsgd_scatter",
            "odsgd_adam_predict")


def library_path():
    """Absolute path of the library `load()` uses: $ODSGD_NATIVE_LIB, else odsgd/lib/."""
    return os.path.abspath(os.environ.get("ODSGD_NATIVE_LIB") or os.path.join(LIB_DIR, LIB_NAME))


def release(version):
    """(major, minor, patch) of a version string such as '1.9.1' or '1.9.1.post0', so that
    versions compare as numbers ('1.10' > '1.9'), never as strings."""
    match = re.match(r"\s*(\d+)(?:\.(\d+))?(?:\.(\d+))?", str(version))
    if not match:
        raise ValueError("cannot parse version %r" % (version,))
    return tuple(int(part or 0) for part in match.groups())


def format_release(parts):
    return ".".join(str(part) for part in parts)


def read_build_info(lib_path):
    """build_info.json beside `lib_path`, as a dict; ImportError when absent or unreadable."""
    info_path = os.path.join(os.path.dirname(lib_path), BUILD_INFO_NAME)
    try:
        with open(info_path) as handle:
            info = json.load(handle)
        release(info["mxnet_version"])
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise ImportError("odsgd: %s has no valid build record (%s: %s); %s"
                          % (lib_path, info_path, err, REBUILD_HINT)) from err
    return info


def sources(suffix):
    """Sorted absolute paths of the library's kvstore_ext/*<suffix> ('.cc' or '.cu'), without
    the check-gpu driver (a program of its own); [] outside a source checkout."""
    if not os.path.isdir(SOURCE_DIR):
        return []
    return sorted(os.path.join(SOURCE_DIR, name) for name in os.listdir(SOURCE_DIR)
                  if name.endswith(suffix) and name != GPU_CHECK_DRIVER)
