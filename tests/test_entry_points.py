"""The entry points and names that outlive the package's reorganisation into worker/, server/,
cluster/ and common/: `python -m odsgd.launch` and `python -m odsgd.emulate` (alias modules of
odsgd.cluster.*, and the new names too), `from odsgd.kvstore import DistODSGD`, and the name
by which pickled learning-rate schedules (states files, the optimizer sent to the servers) find
their rebuild function, old files included. The console commands and odsgd_autoload are
tested in tests/test_launch_options.py and tests/test_autoload.py."""
import os
import pickle
import subprocess
import sys

import pytest

from cluster import REPO


@pytest.mark.parametrize("module,expected", [
    ("odsgd.launch", "--max-restarts N"), ("odsgd.cluster.launch", "--max-restarts N"),
    ("odsgd.emulate", "--remove-orphans"), ("odsgd.cluster.emulate", "--remove-orphans")])
def test_python_m_entry_points(module, expected):
    run = subprocess.run([sys.executable, "-m", module, "--help"], capture_output=True,
                         text=True, timeout=60, cwd=REPO,
                         env=dict(os.environ, PYTHONPATH=REPO))
    assert run.returncode == 0, run.stderr[-3000:]
    assert expected in run.stdout


def test_the_old_module_names_are_the_new_modules():
    import odsgd
    from odsgd import kvstore, launch, emulate, server_schedules
    from odsgd.cluster import emulate as new_emulate, launch as new_launch
    from odsgd.server import schedules
    from odsgd.worker import kvstore as new_kvstore
    assert (kvstore, launch, emulate, server_schedules) == \
        (new_kvstore, new_launch, new_emulate, schedules)
    assert kvstore.DistODSGD is odsgd.DistODSGD
    # the store's public name in reprs and MXNet's error messages
    assert repr(odsgd.DistODSGD) == "<class 'odsgd.kvstore.DistODSGD'>"


#: a schedule pickled (protocol 0) by the version before the reorganisation, as states files
#: and the servers' optimizer hold it: a GluonCV-style linear warm-up then a step decay
OLD_PICKLE = (b"codsgd.server_schedules\n_rebuild\np0\n((lp1\n(dp2\nVmode\np3\nVlinear\np4\n"
              b"sVbase_lr\np5\nF0.0\nsVtarget_lr\np6\nF0.1\nsVnepochs\np7\nI1\n"
              b"sViters_per_epoch\np8\nI10\nsa(dp9\ng3\nVstep\np10\nsg5\nF0.1\nsg6\nF0.0\n"
              b"sg7\nI4\nsg8\nI10\nsVstep_epoch\np11\n(lp12\nI1\nasVstep_factor\np13\nF0.1\n"
              b"sVpower\np14\nF2.0\nsaI0\nF0.1\nI00\ntp15\nRp16\n.")


@pytest.mark.parametrize("module", ["odsgd.server_schedules", "odsgd.training.schedule"])
def test_schedules_pickled_by_an_older_version_load(module):
    """Schedules pickled before the move name odsgd.server_schedules (and before that
    odsgd.training.schedule): both load, and new pickles keep naming the first."""
    from odsgd.server.schedules import ServerSafeSchedule
    from odsgd.training.schedule import build_schedule
    schedule = pickle.loads(OLD_PICKLE.replace(b"odsgd.server_schedules",
                                               module.encode("ascii")))
    assert isinstance(schedule, ServerSafeSchedule)
    expected = build_schedule(0.1, "step", 5, 10, warmup_epochs=1, warmup_lr=0.0,
                              lr_decay=0.1, lr_decay_epoch=[2])
    assert [schedule(u) for u in (1, 5, 10, 11, 25, 40)] == \
        [expected(u) for u in (1, 5, 10, 11, 25, 40)]
    assert b"odsgd.server_schedules\n_rebuild" in pickle.dumps(expected, 0)
