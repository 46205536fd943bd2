"""The import structure of odsgd: the contracts of .importlinter (no import cycles, no module
importing from a floor above its own, odsgd.kvstore not importing odsgd.training,
odsgd.worker.checkpoint and odsgd.worker.trainer_hook not importing the store or the package), checked by
import-linter, which `make install` installs into .venv; and the names the modules that no
longer import the store know it by."""
import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LINT = "from importlinter.cli import lint_imports_command; lint_imports_command()"


def test_import_contracts_are_kept():
    """`lint-imports` over .importlinter: every contract kept (its output on failure)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = REPO + os.pathsep + env.get("PYTHONPATH", "")
    env["COLUMNS"] = "200"   # one line per contract in the report
    try:
        import importlinter  # noqa: F401
    except ImportError:
        raise AssertionError("import-linter is not installed in this Python (%s): `make "
                             "install` installs it, or pip install import-linter"
                             % sys.executable)
    # --no-cache: nothing written into the checkout (.import_linter_cache).
    result = subprocess.run([sys.executable, "-c", LINT, "--no-cache",
                             os.path.join(REPO, ".importlinter")],
                            cwd=REPO, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, universal_newlines=True, timeout=300)
    assert result.returncode == 0, result.stdout
    assert " broken" in result.stdout and ", 0 broken." in result.stdout, result.stdout
    assert " BROKEN" not in result.stdout, result.stdout


def test_helpers_know_the_store_by_its_type():
    """odsgd.worker.checkpoint and odsgd.worker.trainer_hook tell a dist_odsgd store by its type (they do
    not import odsgd.kvstore): the type they look for is DistODSGD's, and a store of
    another type is not one."""
    import mxnet as mx

    from odsgd.worker import checkpoint, trainer_hook
    from odsgd.worker.kvstore import DistODSGD, StoreType

    assert issubclass(DistODSGD, mx.kvstore.KVStoreBase)
    assert DistODSGD.type.fget(None) == StoreType("dist_odsgd")
    assert checkpoint.STORE_TYPE == trainer_hook.STORE_TYPE == DistODSGD.type.fget(None)
    local = mx.kv.create("local")
    assert not checkpoint.is_odsgd_store(local) and not trainer_hook._is_odsgd(local)
    assert not checkpoint.is_odsgd_store(None) and not trainer_hook._is_odsgd(None)
    assert not checkpoint.is_odsgd_store("dist_odsgd")

    class Typed(mx.kvstore.KVStoreBase):   # a store of type 'dist_odsgd', as DistODSGD is
        type = StoreType("dist_odsgd")

    store = Typed.__new__(Typed)
    assert checkpoint.is_odsgd_store(store) and trainer_hook._is_odsgd(store)


def test_server_schedules_keep_their_old_names():
    """server_safe and ServerSafeSchedule moved to odsgd.server_schedules (below the store);
    odsgd.training.schedule still names them, and `_rebuild`, which schedules pickled before
    the move name there."""
    from odsgd.server import schedules as server_schedules
    from odsgd.training import schedule

    for name in ("server_safe", "ServerSafeSchedule", "gluoncv_lr_scheduler_module",
                 "MODES", "_rebuild"):
        assert getattr(schedule, name) is getattr(server_schedules, name), name
    assert server_schedules._rebuild.__module__ == "odsgd.server_schedules"
