"""Misuse and bad configuration (docs/spec.md, section 6): each is a clear error naming the fix,
and a job that makes it exits non-zero; none hangs.

The checks that need no parameter-server job run in this process (they raise before any
ps-lite start); the others run inside a real job (jobs/misuse_job.py)."""
import json
import os
import socket
import subprocess
import sys
import time

import pytest

import odsgd
import odsgd.worker.environment
from cluster import run_job, JobError
from odsgd.worker.config import ODSGDConfig
from test_reliability import assert_no_leftovers, live_jobs  # noqa: F401 (a fixture)

pytestmark = pytest.mark.timeout(120)



@pytest.fixture
def clean_environment(monkeypatch):
    """No DMLC_* nor ODSGD_* variables; a function that sets a worker's DMLC_* variables."""
    for name in list(os.environ):
        if name.startswith(("DMLC_", "ODSGD_")):
            monkeypatch.delenv(name)

    def worker(port, **overrides):
        values = {"DMLC_ROLE": "worker", "DMLC_PS_ROOT_URI": "127.0.0.1",
                  "DMLC_PS_ROOT_PORT": str(port), "DMLC_NUM_SERVER": "1",
                  "DMLC_NUM_WORKER": "2"}
        values.update(overrides)
        for name, value in values.items():
            monkeypatch.setenv(name, value)
    return worker


def free_port():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


# -- DMLC_* environment (in this process) -----------------------------------------------------
def test_missing_dmlc_environment(clean_environment):
    for create in (odsgd.DistODSGD, lambda: __import__("mxnet").kv.create("dist_odsgd")):
        with pytest.raises(ValueError, match="DMLC_ROLE, DMLC_PS_ROOT_URI.*are not set.*"
                                             "python -m odsgd.launch"):
            create()


@pytest.mark.parametrize("name, value", [
    ("DMLC_ROLE", "server"), ("DMLC_NUM_WORKER", "0"), ("DMLC_NUM_WORKER", "two"),
    ("DMLC_NUM_SERVER", "-1"), ("DMLC_PS_ROOT_PORT", "0"), ("DMLC_PS_ROOT_PORT", "70000")])
def test_wrong_dmlc_values(clean_environment, name, value):
    clean_environment(free_port(), **{name: value})
    with pytest.raises(ValueError, match="%s=%r" % (name, value)):
        odsgd.DistODSGD()


def test_port_held_by_another_program(clean_environment, monkeypatch):
    """DMLC_PS_ROOT_PORT is a port where some other program listens (not a ps-lite
    scheduler): ps-lite would wait for an answer forever; the store says so at once."""
    monkeypatch.setattr(odsgd.worker.environment, "SCHEDULER_GREETING_SECONDS", 1.0)
    with socket.socket() as other_program:
        other_program.bind(("127.0.0.1", 0))
        other_program.listen(4)
        clean_environment(other_program.getsockname()[1])
        started = time.time()
        with pytest.raises(ValueError, match="not a ps-lite scheduler .another program holds "
                                             "the port"):
            odsgd.DistODSGD()
    assert time.time() - started < 10


def test_no_scheduler_listening(clean_environment, monkeypatch):
    monkeypatch.setattr(odsgd.worker.environment, "SCHEDULER_WAIT_SECONDS", 1.0)
    clean_environment(free_port())
    with pytest.raises(ValueError, match="no scheduler listens there after 1 s"):
        odsgd.DistODSGD()


def test_unresolvable_scheduler_host(clean_environment):
    clean_environment(free_port(), DMLC_PS_ROOT_URI="no-such-host.invalid")
    with pytest.raises(ValueError, match="the host does not resolve"):
        odsgd.DistODSGD()


def test_scheduler_on_a_port_in_use_fails_fast(clean_environment):
    """A scheduler started by hand on a port another program holds: ps-lite's own check ends
    it with 'bind failed' (odsgd.launch picks a free port, so its jobs never meet this)."""
    with socket.socket() as other_program:
        other_program.bind(("127.0.0.1", 0))
        other_program.listen(4)
        env = dict(os.environ, DMLC_ROLE="scheduler", DMLC_PS_ROOT_URI="127.0.0.1",
                   DMLC_PS_ROOT_PORT=str(other_program.getsockname()[1]), DMLC_NUM_SERVER="1",
                   DMLC_NUM_WORKER="1", DMLC_NODE_HOST="127.0.0.1", OMP_NUM_THREADS="1")
        scheduler = subprocess.run([sys.executable, "-c", "import mxnet"], env=env,
                                   capture_output=True, text=True, timeout=60)
    assert scheduler.returncode != 0
    assert "bind failed" in scheduler.stderr


# -- ODSGD_* environment and constructor arguments (in this process) --------------------------
@pytest.mark.parametrize("name, value, message", [
    ("ODSGD_WARMUP_STEPS", "abc", "ODSGD_WARMUP_STEPS='abc' is not a valid int"),
    ("ODSGD_LOCAL_LR", "fast", "ODSGD_LOCAL_LR='fast' is not a valid float"),
    ("ODSGD_LOCAL_LR", "-0.1", r"local_lr must be >= 0, got -0.1 \(environment\)"),
    ("ODSGD_LOCAL_MOMENTUM", "-0.5", r"local_momentum must be >= 0, got -0.5 \(environment\)"),
    ("ODSGD_COMPENSATION", "-1", r"compensation must be >= 0, got -1.0 \(environment\)"),
    ("ODSGD_COMPENSATION_MODE", "weird", "compensation_mode must be one of"),
    ("ODSGD_LOCAL_OPTIMIZER", "nonsense", "unknown local optimizer 'nonsense' .environment."),
    ("ODSGD_WARMUP_STEPS", "-3", r"warmup_steps must be >= 0, got -3 \(environment\)")])
def test_invalid_odsgd_environment(clean_environment, monkeypatch, name, value, message):
    """Checked before anything else: no DMLC_* variable is needed to get the error."""
    monkeypatch.setenv(name, value)
    with pytest.raises(ValueError, match=message):
        odsgd.DistODSGD()


@pytest.mark.parametrize("arguments, error, message", [
    (dict(local_optimizer="nonsense"), ValueError, "unknown local optimizer 'nonsense'"),
    (dict(local_optimizer="adam", compensation=0.5), ValueError,
     "compensation=0.5 needs local_optimizer 'sgd' or 'predict'"),
    (dict(local_optimizer="sgd", local_optimizer_params={"learning_rate": -0.1}), ValueError,
     "local_lr must be >= 0"),
    (dict(local_optimizer="sgd", local_optimizer_params={"momentum": float("nan")}), TypeError,
     "local_momentum must be a finite number"),
    (dict(compensation=-0.5), ValueError, "compensation must be >= 0"),
    (dict(local_optimizer="predict", local_optimizer_params={"learning_rate": 0.1}),
     ValueError, "takes its rates from the global optimizer"),
    (dict(warmup_steps=-1), ValueError, "warmup_steps must be >= 0"),
    (dict(warmup_steps=2.5), TypeError, "warmup_steps must be an int"),
    (dict(compensation_mode="sometimes"), ValueError, "compensation_mode must be one of"),
    (dict(local_optimizer_params=[0.1]), TypeError, "local_optimizer_params must be a dict"),
    (dict(local_optimizer="adam", local_optimizer_params={"momentum": 0.9}), ValueError,
     "local optimizer 'adam' does not take these arguments.*momentum"),
    (dict(local_optimizer="nag", local_optimizer_params={"no_such_argument": 1}), ValueError,
     "local optimizer 'nag' does not take these arguments")])
def test_invalid_store_arguments(clean_environment, arguments, error, message):
    with pytest.raises(error, match=message):
        odsgd.DistODSGD(**arguments)


@pytest.mark.parametrize("name", ["ODSGD_LOCAL_LR", "ODSGD_LOCAL_MOMENTUM", "ODSGD_LOCAL_WD"])
def test_local_rates_from_the_environment_are_refused_with_predict(clean_environment,
                                                                   monkeypatch, name):
    """docs/env.md: 'predict' takes its rates from the global optimizer, so a local rate in
    the environment is an error naming the variable, not silently ignored."""
    monkeypatch.setenv(name, "0.1")
    with pytest.raises(ValueError, match="takes its rates from the global optimizer, but %s "
                                         "is set" % name):
        odsgd.DistODSGD()
    monkeypatch.setenv("ODSGD_LOCAL_OPTIMIZER", "sgd")
    assert ODSGDConfig().local_optimizer == "sgd"     # accepted with a local optimizer


def test_arguments_win_over_a_valid_environment(clean_environment, monkeypatch):
    monkeypatch.setenv("ODSGD_WARMUP_STEPS", "7")
    assert ODSGDConfig(warmup_steps=3).warmup_steps == 3
    assert ODSGDConfig().warmup_steps == 7


# -- inside a job -----------------------------------------------------------------------------
def test_misuse_inside_a_job(tmp_path):
    """Mistakes that need a running job, on both workers: each raises a clear error and the
    store stays usable for the next."""
    run_job("misuse_job.py", ["--out", tmp_path], timeout=90)
    for rank in range(2):
        with open(tmp_path / ("rank%d.json" % rank)) as f:
            results = json.load(f)
        expected = {
            "pushpull_without_optimizer": "ValueError: dist_odsgd has no optimizer: call "
                                          "kv.set_optimizer",
            "sparse_weight": "TypeError: dist_odsgd supports dense weights only, got stype "
                             "'row_sparse'",
            "sparse_gradient": "TypeError: dist_odsgd supports dense gradients only",
            "sparse_gradient_trainer": "ValueError: Cannot use <class "
                                       "'odsgd.kvstore.DistODSGD'> for multi-device training "
                                       "with sparse gradients",
            "equal_steps_negative": "ValueError: equal_steps needs this worker's number of "
                                    "batches, an int >= 0, got -1",
            "update_on_kvstore_false": "ValueError: dist_odsgd updates the weights itself and "
                                       "needs pushpull(key, grad, out=weight): create the "
                                       "Trainer with update_on_kvstore=True",
            "gradient_compression": "ValueError: dist_odsgd does not support gradient "
                                    "compression ({'type': '2bit', 'threshold': 0.5})",
            "row_sparse_pull": "TypeError: dist_odsgd supports dense weights only, got "
                               "row_sparse_pull; use kvstore='dist_sync' for sparse "
                               "parameters or gradients"}
        assert results["no_gradient_compression"] is None   # {'type': 'none'} is no change
        for case, start in expected.items():
            assert results[case] is not None and results[case].startswith(start), \
                "rank %d, %s: %r" % (rank, case, results[case])
        # what it says of MXNet's own stores is what MXNet 1.9.1 does (it refuses compression
        # with pushpull, which gluon.Trainer and Module.fit use)
        assert "Compression not supported with PushPull" in results["gradient_compression"]
        assert "use kvstore='dist_sync' for compressed pushes" not in \
            results["gradient_compression"]
        if rank == 0:
            assert results["shape_check"] is None
        else:
            assert results["shape_check"] == (
                "ValueError: parameter shapes differ between workers: key 600 is (3, 6) "
                "float32 (key id 600) on worker 1 but (3, 5) float32 (key id 600) on rank 0; "
                "every worker must build the same model and initialise its parameters in the "
                "same order")


def test_invalid_environment_ends_the_job(tmp_path):
    started = time.time()
    with pytest.raises(JobError) as failure:
        run_job("quadratic_job.py", ["--out", tmp_path], timeout=60,
                env={"ODSGD_WARMUP_STEPS": "abc"})
    output = str(failure.value)
    assert "failed (exit 1)" in output
    assert "ODSGD_WARMUP_STEPS='abc' is not a valid int" in output
    assert time.time() - started < 40


def test_mismatched_shapes_end_the_job(live_jobs):
    """Workers with different models: the job ends at the first pull with an error saying so,
    instead of a wrong result or a hang."""
    job = live_jobs("shape_mismatch_job.py", [], timeout=60)
    code = job.finish()
    output = job.output
    assert code != 0
    assert "parameter shapes differ between workers" in output, output[-3000:]
    assert time.time() - job.started_at < 40
    assert_no_leftovers(job)


def test_checkpoint_calls_refuse_what_they_cannot_resume(clean_environment, tmp_path):
    import mxnet as mx
    net = mx.gluon.nn.Dense(3, in_units=5)
    net.initialize()
    with pytest.raises(TypeError, match="load_checkpoint needs a gluon.Trainer"):
        odsgd.load_checkpoint(net, str(tmp_path / "ckpt"))
    local = mx.gluon.Trainer(net.collect_params(), "sgd", kvstore="device")
    # MXNet's own stores are checkpointed too (odsgd/worker/mxnet_store_checkpoint.py): a prefix with
    # nothing saved is refused by name
    with pytest.raises(ValueError, match="ckpt-worker0.states is missing: no checkpoint of this "
                                         "worker at prefix"):
        odsgd.load_checkpoint(local, str(tmp_path / "ckpt"))
    local = mx.gluon.Trainer(net.collect_params(), "sgd", kvstore="device")
    with pytest.raises(ValueError, match="save_checkpoint before the first trainer.step"):
        odsgd.save_checkpoint(local, str(tmp_path / "ckpt"))
    with pytest.raises(ValueError, match="equal_steps needs a Trainer or Module that trains "
                                         "with kvstore='dist_odsgd'"):
        odsgd.equal_steps(local, 3)
    with mx.autograd.record():
        loss = net(mx.nd.ones((2, 5))).sum()
    loss.backward()
    local.step(2)   # a step without odsgd.resume_or_start before it
    with pytest.raises(ValueError, match="save_checkpoint with kvstore='local' needs "
                                         r"odsgd.resume_or_start\(trainer, directory\)"):
        odsgd.save_checkpoint(local, str(tmp_path / "ckpt"))
    with pytest.raises(ValueError, match=r"resume_or_start \(or prepare_checkpoints\) must come "
                                         "before the first trainer.step with kvstore='local'"):
        odsgd.resume_or_start(local, str(tmp_path))
