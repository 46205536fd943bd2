"""Makes kvstore type 'dist_odsgd' mean OD-SGD in every Python process of this environment,
whether or not the training script imports odsgd.

MXNet's `mx.kv.create(name)` looks `name` up in its registry of Python stores, which only
`import odsgd` fills, and otherwise hands the name to its C++ factory: that builds a plain
dist_sync store whose type reads 'dist_odsgd' (docs/spec.md, section 7). A script that only passes
'dist_odsgd' as a string (MXNet's example/image-classification `--kv-store`, GluonCV's
`--kvstore`) would train with another algorithm, silently, and Module would even scale its
gradients differently. So `pip install` puts `odsgd-autoload.pth` into site-packages, whose
one line runs `install()` below at interpreter start-up.

`install()` costs nothing at start-up: it imports neither mxnet nor odsgd. It adds an import
hook that waits for `mxnet.kvstore.base` (where `create` lives) and wraps `create` there,
before `mxnet.kvstore` re-exports it, so that `create('dist_odsgd')` imports odsgd (which
registers the real store) first. Any other name goes to MXNet's own `create`. Where odsgd cannot be
imported, `create('dist_odsgd')` raises instead of falling back.

The same wrapper is where a job's commands get signed and checked (docs/cluster.md, "Who may
reach a job"): a server's loop starts inside `import mxnet` with `create('dist')`, so that call
is the last moment to wrap the server's command handler; a worker's dist store signs what it
sends from its creation on (`guard_commands`).
"""
import importlib.abc
import os
import sys

STORE_NAME = "dist_odsgd"
_TARGET = "mxnet.kvstore.base"


def _job_key_module():
    """odsgd/common/job_key.py, loaded by its path: importing it through the package would run
    odsgd/__init__.py, which imports the whole store on a worker."""
    name = "odsgd.common.job_key"
    if name not in sys.modules:
        import importlib.util
        package = importlib.util.find_spec("odsgd")
        if package is None or not package.submodule_search_locations:
            raise ImportError("the odsgd package is not installed in this Python")
        path = os.path.join(list(package.submodule_search_locations)[0], "common",
                            "job_key.py")
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        sys.modules[name] = module
    return sys.modules[name]


def guard_commands(name):
    """Before MXNet makes store `name`: on a server (or scheduler), MXNet's server loop is
    about to start inside `import mxnet` (mxnet/kvstore/kvstore_server.py makes a 'dist' store,
    then runs KVStoreServer): its command handler is wrapped so that it checks each command's
    MAC under the job's key (odsgd/server/command_guard.py). On a worker making a dist store,
    MXNet's command sender signs with that key (odsgd/common/job_key.py). A key file that
    cannot be used is an error here, before the job starts."""
    role = os.environ.get("DMLC_ROLE")
    if role in ("server", "scheduler"):
        server_class = getattr(sys.modules.get("mxnet.kvstore.kvstore_server"),
                               "KVStoreServer", None)
        if server_class is None:
            return
        try:
            from odsgd.server import command_guard   # light here: odsgd/__init__.py
        except Exception as error:                 # imports nothing on a server
            if role == "server" and os.environ.get("ODSGD_JOB_KEY_FILE"):
                sys.stderr.write("odsgd server: this job has a key, but its command check "
                                 "cannot be imported (%s: %s); the server ends\n"
                                 % (type(error).__name__, error))
                os._exit(1)
            return
        command_guard.install(server_class, role)
    elif name.lower().startswith("dist"):
        kvstore_class = getattr(sys.modules.get("mxnet.kvstore.kvstore"), "KVStore", None)
        if kvstore_class is not None:
            try:
                job_key = _job_key_module()
            except ImportError as error:
                if os.environ.get("ODSGD_JOB_KEY_FILE"):
                    raise ImportError("this job has a key (ODSGD_JOB_KEY_FILE), but odsgd, "
                                      "which signs its commands, cannot be loaded (%s); "
                                      "repair the installation (make install)" % error)
                return   # no key: nothing to sign
            job_key.job_key()   # a bad key file fails here, naming the fix
            job_key.sign_commands_of(kvstore_class)


def wrap_create(base):
    """Replaces `base.create` (mxnet.kvstore.base) by one that guards the job's commands
    (`guard_commands`) and imports odsgd before it creates a 'dist_odsgd' store."""
    original = base.create
    if getattr(original, "_odsgd_wrapped", False):
        return

    def create(name="local"):
        if isinstance(name, str) and name.lower() == STORE_NAME \
                and STORE_NAME not in base.KVStoreBase.kv_registry:
            try:
                import odsgd  # noqa: F401  (registers DistODSGD under 'dist_odsgd')
            except Exception as error:
                raise ImportError(
                    "kvstore %r is OD-SGD, which needs the odsgd package, and importing it "
                    "failed (%s: %s); MXNet would otherwise run plain dist_sync under this "
                    "name. Repair the installation (make install) or use kvstore='dist_sync'"
                    % (STORE_NAME, type(error).__name__, error)) from error
            if STORE_NAME not in base.KVStoreBase.kv_registry:
                raise ImportError(
                    "odsgd was imported but did not register kvstore %r (is DMLC_ROLE set to "
                    "'server' or 'scheduler' in a worker?)" % STORE_NAME)
        if isinstance(name, str):
            guard_commands(name)
        return original(name)

    create.__doc__ = original.__doc__
    create.__name__ = original.__name__
    create._odsgd_wrapped = True
    base.create = create


class _WrappingLoader(importlib.abc.Loader):
    def __init__(self, loader):
        self.loader = loader

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module):
        self.loader.exec_module(module)
        wrap_create(module)


class _Finder(importlib.abc.MetaPathFinder):
    """Finds mxnet.kvstore.base through the other finders and wraps its loader."""

    def find_spec(self, name, path, target=None):
        if name != _TARGET:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _WrappingLoader(spec.loader)
                return spec
        return None


def install():
    """Wraps mxnet.kvstore.base.create now if MXNet is imported, else when it is."""
    if _TARGET in sys.modules:
        wrap_create(sys.modules[_TARGET])
        return
    if not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder())


def is_active():
    """True when this process will get OD-SGD from create('dist_odsgd')."""
    base = sys.modules.get(_TARGET)
    if base is not None:
        return getattr(base.create, "_odsgd_wrapped", False) or \
            STORE_NAME in base.KVStoreBase.kv_registry
    return any(isinstance(f, _Finder) for f in sys.meta_path)


PTH_NAME = "odsgd-autoload.pth"
PTH_LINE = "import odsgd_autoload; odsgd_autoload.install()\n"


def install_pth(site_packages=None):
    """Writes odsgd-autoload.pth into `site_packages` (default: this interpreter's purelib).
    `pip install .` installs the same file as a data file; an editable install (`pip install
    -e .`, what `make install` does) does not, so `make install` runs this."""
    import sysconfig
    folder = site_packages or sysconfig.get_path("purelib")
    path = os.path.join(folder, PTH_NAME)
    with open(path, "w") as f:
        f.write(PTH_LINE)
    return path


if __name__ == "__main__":
    print("odsgd: wrote %s (kvstore 'dist_odsgd' is OD-SGD in every process of this "
          "environment)" % install_pth())
