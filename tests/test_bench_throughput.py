"""The throughput benchmark at tiny sizes: real jobs, a real shaped network namespace."""
import json
import subprocess
import sys

import pytest

from odsgd.bench.throughput_job import mlp_parameter_count

pytestmark = pytest.mark.timeout(400)

HIDDEN, WORKERS, BANDWIDTH = 128, 2, 100


def namespaces():
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return {line.split()[0] for line in out.splitlines() if line.strip()}


def test_throughput_benchmark_tiny(tmp_path):
    out = tmp_path / "tp.json"
    command = [sys.executable, "-m", "odsgd.bench", "throughput", "--mlp-hidden", HIDDEN,
               "--batch-size", 16, "--workers", WORKERS, "--bandwidth-mbit", "0,%d" % BANDWIDTH,
               "--steps", 4, "--skip", 2, "--repeats", 1, "--warmup-steps", 1, "--overlap-interval", 2, "--json", out, "--timeout", 150]
    process = subprocess.Popen([str(c) for c in command], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    try:
        stdout, stderr = process.communicate(timeout=380)
    finally:
        process.kill()
    run = subprocess.CompletedProcess(command, process.returncode, stdout, stderr)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "samples/s" in run.stdout                      # the console table
    runs = json.loads(out.read_text())["runs"]
    assert {(r["mode"], r["bandwidth_mbit"]) for r in runs} == {
        (m, b) for m in ("dist_sync", "dist_async", "dist_odsgd") for b in (0, BANDWIDTH)}
    for r in runs:
        for key in ("samples_per_sec", "samples_per_sec_min", "samples_per_sec_max",
                    "t_comp", "t_comm", "ideal_samples_per_sec"):
            assert r[key] > 0, (key, r)
        assert r["samples_per_sec_min"] <= r["samples_per_sec"] <= r["samples_per_sec_max"]
        assert r["ideal_samples_per_sec"] == pytest.approx(
            WORKERS * 16 / max(r["t_comp"], r["t_comm"]))
    # The shaping is real: each step moves every parameter up (push) and down (pull) for
    # each worker through the one shaped loopback, which cannot take it faster than its rate.
    step_bits = 2 * WORKERS * 4 * mlp_parameter_count(HIDDEN) * 8
    shaped = next(r for r in runs if r["bandwidth_mbit"] == BANDWIDTH)
    assert shaped["t_comm"] >= 0.8 * step_bits / (BANDWIDTH * 1e6)
    od = next(r for r in runs if r["mode"] == "dist_odsgd" and r["bandwidth_mbit"] == 0)
    assert od["overlap_mean_wait_s"] >= 0 and 0 <= od["overlap_hidden_fraction"] <= 1
    assert (tmp_path / "tp.png").stat().st_size > 10000    # the plot
    # the benchmark's namespaces (named after its pid) are gone; others' may come and go
    assert [n for n in namespaces() if n.startswith("odsgd-%d-" % process.pid)] == []
