"""The throughput benchmark's CPU meter and stall timeout, and the many-array models in every
mode: real processes, real jobs."""
import json
import os
import subprocess
import sys
import time

import pytest

from odsgd.bench.cpu_meter import JobCPUMeter, MARKER
from odsgd.bench.jobs import JobFailed, run_job

pytestmark = pytest.mark.timeout(300)

BURN = """
import time
start = time.process_time()
while time.process_time() - start < {seconds}:
    pass
print(time.process_time() - start, flush=True)
"""


def processes_with(token):
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open("/proc/%s/environ" % name, "rb") as f:
                    if ("%s=%s" % (MARKER, token)).encode() in f.read().split(b"\0"):
                        found.append(int(name))
            except OSError:
                pass
    return found


def test_cpu_meter_counts_a_childs_cpu_inside_a_window():
    """Two processes burn CPU; the meter's total over their lifetime equals what they report
    with their own process_time (all cores), within the sampling interval's error."""
    meter = JobCPUMeter(interval=0.05)
    env = dict(os.environ, **meter.environment)
    with meter:
        start = time.time()
        children = [subprocess.Popen([sys.executable, "-c", BURN.format(seconds=0.8)], env=env,
                                     stdout=subprocess.PIPE, text=True) for _ in range(2)]
        own = [float(c.communicate(timeout=60)[0]) for c in children]
        end = time.time()
    measured = meter.cpu_in(start, end)
    assert set(measured) == {"launcher"}                  # no DMLC_ROLE in their environment
    # Start-up (interpreter import) before the first sample is not counted; the burn is.
    assert measured["launcher"] == pytest.approx(sum(own), abs=0.25)
    # A window before anything ran holds nothing.
    assert sum(meter.cpu_in(start - 10, start - 5).values()) == 0


SERVE = """
import sys, time
print("ready", flush=True)
for line in sys.stdin:
    start = time.process_time()
    while time.process_time() - start < float(line):
        pass
    print(time.process_time() - start, flush=True)
"""


def test_a_window_shorter_than_the_sampling_period_has_its_cpu(monkeypatch):
    """The bug of a fresh clone's KeyError cpu_bound_samples_per_sec: a timed window that
    falls between two of the meter's samples. Here the meter samples every 30 s and the
    window lasts about 0.25 s, in which a child of the job (it carries the job's marker)
    burns CPU on each step and is idle otherwise. The benchmark job's edge samples
    (throughput_job.timed's cpu_edges) given to the meter make the window's CPU figure that
    of the child: the CPU time it reports itself (clock_gettime, not /proc), within two
    clock ticks of /proc's counters."""
    import mxnet  # noqa: F401 - imported before the window, as in the job
    from odsgd.bench import throughput, throughput_job
    meter = JobCPUMeter(interval=30)
    env = dict(os.environ, **meter.environment)
    child = subprocess.Popen([sys.executable, "-c", SERVE], env=env, stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "ready"
        burned = []

        def step():
            child.stdin.write("0.05\n")
            child.stdin.flush()
            burned.append(float(child.stdout.readline()))

        with meter:
            time.sleep(0.1)                     # the meter's one sample, long before
            monkeypatch.setenv(MARKER, meter.token)   # as in every process of the job
            _, result = throughput_job.timed(step, 0, 5)
    finally:
        child.stdin.close()
        child.wait(timeout=30)
    start, end = result["window"]
    assert end - start < meter.interval
    # the periodic samples alone hold nothing of the window
    assert sum(meter.cpu_in(start, end).values()) < 0.5 * sum(burned)
    cores = throughput.window_cores(meter, [result])
    assert set(cores) == {"launcher"}                  # no DMLC_ROLE in its environment
    ticks = 2.0 / os.sysconf("SC_CLK_TCK")
    assert cores["launcher"] * (end - start) == pytest.approx(sum(burned), abs=ticks + 0.005)


def test_a_job_that_stops_printing_ends_with_the_reason():
    meter = JobCPUMeter()
    tic = time.time()
    with meter, pytest.raises(JobFailed) as failure:
        # 20 s: the launcher and MXNet's import take several seconds on a busy machine
        run_job(["tests.jobs.silent_job"], workers=1, servers=1, timeout=600,
                env=meter.environment, stall_timeout=20)
    assert time.time() - tic < 20 + 40
    assert "made no progress" in str(failure.value) and "silent job started" in str(failure.value)
    assert processes_with(meter.token) == []               # the whole job is gone


# ResNet-20 in every mode; the dense net (MXNet's own stores run it as they run ResNet-20's
# arrays) in dist_odsgd only, whose fused groups and parts it exercises differently. 30 steps
# make a window that /proc's clock ticks can measure (3 steps measured up to 2.2 cores on this
# 2-core machine, a resolution of 2.5 cores). ResNet-20's 3 steps were enough while the window
# ended with a drain of everything; with edges at the weights' readiness its 3-step window is
# the busy steps alone, and its tick error put a CPU-bound job at 2.12 cores: 30 steps (about
# 32 ms each here) keep the error near 0.05 cores.
@pytest.mark.parametrize("model,extra,modes,steps", [
    ("cifar_resnet20_v1", ["--image-size", "32"], ["dist_async", "dist_odsgd", "dist_sync"], 30),
    ("dense", ["--dense-layers", "30", "--dense-width", "8"], ["dist_odsgd"], 30),
])
def test_many_array_models_run_in_every_mode(tmp_path, model, extra, modes, steps):
    out = tmp_path / "tp.json"
    command = [sys.executable, "-m", "odsgd.bench", "throughput", "--model", model,
               "--batch-size", "4", "--bandwidth-mbit", "0", "--steps", str(steps), "--skip", "2",
               "--repeats", "1", "--warmup-steps", "1", "--overlap-interval", "2",
               "--modes", ",".join(modes), "--json", str(out), "--timeout", "150",
               "--stall-timeout", "60"] + extra
    run = subprocess.run(command, capture_output=True, text=True, timeout=280)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    runs = json.loads(out.read_text())["runs"]
    assert sorted(r["mode"] for r in runs) == modes
    arrays = {"cifar_resnet20_v1": 65, "dense": 60}[model]
    for r in runs:
        assert r["parameter_arrays"] == arrays
        # Every process's CPU in the timed window: workers and the server show up, and the
        # job cannot use more cores than the machine has (10% for sampling error, and the
        # clock-tick resolution of /proc's CPU times over this window of 3 short steps).
        assert {"worker", "server"} <= set(r["cores_in_use_by_role"]), r
        assert 0 < r["cores_resolution"]
        assert 0 < r["cores_in_use"] <= 1.1 * len(os.sched_getaffinity(0)) + \
            r["cores_resolution"]
        assert r["cpu_bound_samples_per_sec"] >= r["samples_per_sec"] * 0.95
        assert r["bound_samples_per_sec"] == r["cpu_bound_samples_per_sec"]   # unshaped


def test_timed_window_edges_wait_only_for_what_the_next_step_needs():
    """throughput_job.timed calls `settle` (training: a wait for the trained weights) at the
    window's two edges and at each progress line, not a wait for everything: a round kept in
    flight across steps (dist_odsgd's) is in flight at both edges, as in a long run. Here a
    settle that takes 50 ms at the end edge only: the window holds it, and each step's 10 ms."""
    from odsgd.bench import throughput_job
    calls = []

    def settle():
        calls.append(time.time())
        if len(calls) == 7:
            time.sleep(0.05)

    seconds, result = throughput_job.timed(lambda: time.sleep(0.01), 2, 3, progress_every=0.0,
                                           settle=settle)
    # 2 untimed progress lines, the start edge, 3 timed progress lines, the end edge
    assert len(calls) == 7
    start, end = result["window"]
    assert calls[2] <= start <= calls[3] and end >= calls[6] + 0.05
    assert seconds == pytest.approx((end - start) / 3)
    assert seconds >= 0.01 + 0.05 / 3
    calls.clear()
    throughput_job.timed(lambda: None, 1, 2, progress_every=3600.0, settle=settle)
    assert len(calls) == 2                     # the two edges only
