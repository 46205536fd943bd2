"""kvstore type 'dist_odsgd' is OD-SGD in every worker of a job, also where the training script
never imports odsgd (odsgd_autoload.py, docs/spec.md, section 7): never MXNet's plain dist_sync under
our name, and where odsgd cannot be imported, a clear error."""
import json
import os
import subprocess
import sys
import sysconfig

import pytest

import odsgd_autoload
from cluster import REPO, run_job


def _reports(output, path):
    lines = [json.loads(line.split("no_import_job ", 1)[1]) for line in output.splitlines()
             if "no_import_job {" in line]
    return sorted((r for r in lines if r["path"] == path), key=lambda r: r["rank"])


def test_the_environment_runs_the_autoload_line_at_start_up():
    """make install / pip install put odsgd-autoload.pth into site-packages with the line that
    installs the hook; the repository's copy (pip's data file) says the same."""
    installed = os.path.join(sysconfig.get_path("purelib"), odsgd_autoload.PTH_NAME)
    with open(installed) as f:
        assert f.read() == odsgd_autoload.PTH_LINE
    with open(os.path.join(REPO, odsgd_autoload.PTH_NAME)) as f:
        assert f.read() == odsgd_autoload.PTH_LINE
    started = subprocess.run(
        [sys.executable, "-c", "import sys, odsgd_autoload; "
         "print(odsgd_autoload.is_active(), 'mxnet' in sys.modules, 'odsgd' in sys.modules)"],
        capture_output=True, text=True, timeout=60, check=True)
    # hooked at start-up, and nothing heavy imported for it
    assert started.stdout.split() == ["True", "False", "False"]


@pytest.mark.parametrize("path", ["create", "gluon", "module"])
def test_a_script_that_never_imports_odsgd_gets_the_odsgd_store(path):
    """mx.kv.create('dist_odsgd'), gluon.Trainer(kvstore='dist_odsgd') and
    Module.fit(kvstore='dist_odsgd') in a 2-worker job whose script has no `import odsgd`."""
    output = run_job("no_import_job.py", [path], workers=2, servers=1, timeout=120)
    reports = _reports(output, path)
    assert [r["rank"] for r in reports] == [0, 1], output[-3000:]
    for report in reports:
        assert report["store"] == "odsgd.kvstore.DistODSGD"
        assert report["type"] == "dist_odsgd" and report["num_workers"] == 2
        if path == "module":
            # Module scales gradients as for dist_sync: 1 / (batch size x workers)
            assert report["rescale_grad"] == pytest.approx(1.0 / (report["batch"] * 2),
                                                           rel=1e-12)


def test_create_refuses_to_fall_back_when_odsgd_cannot_be_imported():
    """Where `import odsgd` fails, create('dist_odsgd') raises ImportError naming the fix,
    instead of handing the name to MXNet's C++ factory (a dist_sync store)."""
    code = ("import sys; sys.modules['odsgd'] = None\n"
            "import mxnet as mx\n"
            "try:\n"
            "    mx.kv.create('dist_odsgd')\n"
            "except ImportError as e:\n"
            "    print('REFUSED', e)\n"
            "else:\n"
            "    print('FELL BACK')\n")
    env = dict(os.environ, DMLC_ROLE="worker", DMLC_PS_ROOT_URI="127.0.0.1",
               DMLC_PS_ROOT_PORT="1", DMLC_NUM_SERVER="1", DMLC_NUM_WORKER="1")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, env=env)
    assert "REFUSED" in done.stdout, done.stdout + done.stderr
    assert "make install" in done.stdout and "dist_sync" in done.stdout
