"""The throughput benchmark at tiny sizes: real jobs, a real shaped network namespace."""
import json
import subprocess
import sys

import pytest

from odsgd.bench.throughput_job import mlp_parameter_count

pytestmark = pytest.mark.timeout(400)

HIDDEN, WORKERS, BANDWIDTH = 128, 2, 200
M = 10 ** 6                        # bytes of parameters, for the closed forms below
B_MBIT = 1000                      # R = 125e6 bytes/s: M takes 8 ms on one queue


@pytest.mark.timeout(30)
@pytest.mark.parametrize("topology,workers,servers,full_ms,half_ms", [
    # hosts: max(M/R, N*M/(S*R)), R the rate of one NIC direction; the half-duplex figure
    # counts both directions of that NIC
    ("hosts", 2, 1, 16.0, 32.0),       # the server NIC: 2 M in, 2 M out, at once
    ("hosts", 4, 2, 16.0, 32.0),       # each server NIC: 4 M / 2
    ("hosts", 1, 1, 8.0, 16.0),        # worker and server NIC alike: M each way
    ("hosts", 1, 2, 8.0, 16.0),        # the worker's NIC: M up, M down; servers M/2 each
    ("hosts", 3, 2, 12.0, 24.0),       # servers: 1.5 M each way
    ("hosts", 2, 4, 8.0, 16.0),        # more servers than workers: the workers' NICs
    # loopback: one tbf on lo's egress, which every push and pull passes once: 2 N M / B
    ("loopback", 2, 1, 32.0, 32.0),
    ("loopback", 4, 2, 64.0, 64.0),
    ("loopback", 1, 1, 16.0, 16.0),
])
def test_link_bound_closed_forms(topology, workers, servers, full_ms, half_ms):
    from odsgd.bench.jobs import link_step_seconds, step_wire_bits, step_wire_bytes
    assert link_step_seconds(topology, workers, servers, M, B_MBIT) == \
        pytest.approx(full_ms / 1e3)
    assert link_step_seconds(topology, workers, servers, M, B_MBIT, duplex="half") == \
        pytest.approx(half_ms / 1e3)
    assert step_wire_bytes(topology, workers, servers, M) == pytest.approx(full_ms * M / 8)
    assert step_wire_bits(topology, workers, servers, M) == pytest.approx(full_ms * M)
    assert link_step_seconds(topology, workers, servers, M, 0) is None     # unshaped


@pytest.mark.timeout(30)
def test_link_bound_refuses_unknown_inputs():
    from odsgd.bench.jobs import step_wire_bytes
    for bad in [("ring", 2, 1, M), ("hosts", 0, 1, M), ("hosts", 2, 0, M)]:
        with pytest.raises(ValueError):
            step_wire_bytes(*bad)
    with pytest.raises(ValueError):
        step_wire_bytes("hosts", 2, 1, M, duplex="simplex")


@pytest.mark.timeout(30)
def test_bound_fields_and_table(capsys):
    """The summary of a made-up run (no jobs): hosts, N=2, S=1, M=1 MB at 1000 Mbit/s, batch
    100 per worker: t_link 16 ms, link bound 200 / 0.016 = 12500 samples/s, half-duplex 6250.
    Repeats at 10000 samples/s on 1 of 2 cores (CPU bound 20000) and at 4000 on 2 of 2 cores
    (CPU bound 4000): bound min(20000, 12500) = 12500 and 4000, median 8250."""
    import argparse
    from odsgd.bench import throughput
    args = argparse.Namespace(workers=2, servers=1, batch_size=100, topology="hosts",
                              model="mlp", mlp_hidden=8, dense_layers=1, dense_width=1,
                              image_size=8, cores=2)
    compute = {"t_comp": 0.01, "parameter_arrays": 2, "parameter_bytes": M}
    cores = [{"worker": 0.75, "server": 0.25}, {"worker": 1.5, "server": 0.5}]
    runs = throughput._summarise(args, B_MBIT, {"dist_sync": [10000.0, 4000.0]}, compute,
                                 0.02, [], {"dist_sync": cores})
    runs += throughput._summarise(args, 0, {"dist_sync": [10000.0, 4000.0]}, compute,
                                  0.005, [], {"dist_sync": cores})
    shaped, unshaped = runs
    assert (shaped["topology"], shaped["workers"], shaped["servers"],
            shaped["parameter_bytes"], shaped["link_bytes_per_sec"]) == \
        ("hosts", 2, 1, M, 125e6)
    assert shaped["link_formula"] == "max(M/R, N*M/(S*R))"
    assert shaped["wire_bytes_per_step"] == 2 * M
    assert shaped["wire_seconds"] == pytest.approx(0.016)
    assert shaped["half_duplex_wire_seconds"] == pytest.approx(0.032)
    assert shaped["link_bound_samples_per_sec"] == pytest.approx(12500)
    assert shaped["half_duplex_link_bound_samples_per_sec"] == pytest.approx(6250)
    assert shaped["cpu_bound_samples_per_sec"] == pytest.approx(12000)    # median(20000, 4000)
    assert shaped["bound_samples_per_sec"] == pytest.approx(8250)
    assert shaped["half_duplex_bound_samples_per_sec"] == pytest.approx(5125)  # (6250+4000)/2
    assert unshaped["link_bound_samples_per_sec"] is None
    assert unshaped["bound_samples_per_sec"] == pytest.approx(12000)
    throughput.print_table(runs)
    table = capsys.readouterr().out
    header = next(line for line in table.splitlines() if "x bound" in line)
    assert "link bnd" in header and "CPU bnd" in header
    row = next(line for line in table.splitlines()
               if "dist_sync" in line and "Mbit/s" in line)
    # link bound, CPU bound, bound and 7000 / 8250 = 0.85 beside it
    assert "12500.0" in row and "12000.0" in row and "8250.0" in row and " 0.85 " in row
    assert "max(M/R, N*M/(S*R)) = 16.0 ms" in table and "half-duplex 6250.0" in table


@pytest.mark.timeout(30)
@pytest.mark.parametrize("t_comp,one_direction,push,pull,step", [
    (10.0, 16.0, 8.0, 8.0, 16.0),       # the link binds: (8 + 8 + 10) / 2 = 13 < 16
    (30.0, 16.0, 16.0, 16.0, 31.0),     # the two-step chain: (16 + 16 + 30) / 2 = 31 > 30
    (50.0, 16.0, 16.0, 16.0, 50.0),     # computation binds: (16 + 16 + 50) / 2 = 41 < 50
    (0.0, 0.0, 0.0, 0.0, 0.0),
])
def test_odsgd_step_model_closed_forms(t_comp, one_direction, push, pull, step):
    from odsgd.bench import throughput
    assert throughput.odsgd_step_seconds(t_comp, one_direction, push, pull) == \
        pytest.approx(step)
    if step:
        assert throughput.predicted_samples_per_sec(256, t_comp, one_direction, push, pull) \
            == pytest.approx(256 / step)


@pytest.mark.timeout(30)
def test_step_model_waits_for_the_last_keys_answer_only():
    """With the step's keys sent as separate requests, the chain holds the whole push and the
    largest key's share of the pull: (16 + 0.25 * 16 + 30) / 2 = 25 against 31 for one key."""
    from odsgd.bench import throughput
    assert throughput.odsgd_step_seconds(30.0, 16.0, 16.0, 16.0, 0.25) == pytest.approx(30.0)
    assert throughput.odsgd_step_seconds(20.0, 16.0, 16.0, 16.0, 0.25) == pytest.approx(20.0)
    assert throughput.odsgd_step_seconds(20.0, 8.0, 16.0, 16.0, 0.5) == pytest.approx(22.0)


@pytest.mark.timeout(30)
@pytest.mark.parametrize("sizes,fusion,parts,share", [
    ([1048576, 1024, 1048576, 1024, 10240, 10], 65536, 262144, 262144 / 2109450.0),
    ([1048576, 1024, 1048576, 1024, 10240, 10], 65536, 0, 1048576 / 2109450.0),
    ([100, 100, 100, 100], 250, 0, 200 / 400.0),     # two fused keys of two arrays
    ([100, 100, 100, 100], 250, 150, 100 / 400.0),   # each cut in two parts of 100
    ([300], 0, 100, 100 / 300.0),                    # equal parts
    ([301], 0, 100, 76 / 301.0),                     # four parts: 76, 75, 75, 75
])
def test_largest_key_share(sizes, fusion, parts, share):
    from odsgd.bench import throughput
    assert throughput.largest_key_share(sizes, fusion, parts) == pytest.approx(share)


@pytest.mark.timeout(30)
@pytest.mark.parametrize("topology,workers,servers,push_ms", [
    ("hosts", 2, 1, 16.0),      # into the server NIC: 2 M; out of it (pulls): 2 M
    ("hosts", 4, 2, 16.0),      # each server NIC: 4 M / 2 each way
    ("hosts", 1, 2, 8.0),       # the worker's NIC: M up, M down
    ("loopback", 2, 1, 16.0),   # one queue: N M of pushes and N M of pulls (t_link 32)
    ("loopback", 4, 2, 32.0),
])
def test_push_and_pull_times_closed_forms(topology, workers, servers, push_ms):
    from odsgd.bench import throughput
    from odsgd.bench.jobs import link_step_seconds
    # at the whole rate (test_bench_plan.test_payload_share: the share TCP's headers leave)
    push, pull = throughput.push_pull_seconds(topology, workers, servers, M, B_MBIT, 1.0)
    assert (push, pull) == (pytest.approx(push_ms / 1e3), pytest.approx(push_ms / 1e3))
    t_link = link_step_seconds(topology, workers, servers, M, B_MBIT)
    # hosts: pushes and pulls each fill one direction; loopback: both share the one queue
    assert (push if topology == "hosts" else push + pull) == pytest.approx(t_link)
    # by default each at the topology's payload share: 1448 / 1514 on hosts, all on loopback
    share = 1448 / 1514.0 if topology == "hosts" else 1.0
    assert throughput.push_pull_seconds(topology, workers, servers, M, B_MBIT) == \
        (pytest.approx(push_ms / 1e3 / share), pytest.approx(push_ms / 1e3 / share))
    assert throughput.push_pull_seconds(topology, workers, servers, M, 0) is None


@pytest.mark.timeout(30)
def test_predicted_rate_of_dist_odsgd(capsys):
    """The made-up run of test_bound_fields_and_table for dist_odsgd: CPU seconds per step
    median(1.0 * 200 / 10000, 2.0 * 200 / 4000) = 0.06, over 2 cores 30 ms > t_comp 10 ms, so
    the model's t_comp is 30 ms. hosts: the bound's t_link 16 ms, the model's at TCP's
    payload share 1448 / 1514: t_link = push = pull = 16.73 ms, T = max(30, 16.73, (16.73 +
    16.73 + 30) / 2 = 31.73) = 31.73 ms, 200 / 0.03173 samples/s. loopback: t_link 32 ms,
    push = pull = 16 ms, T = max(30, 32, 31) = 32 ms. Unshaped and other modes: none."""
    import argparse
    from odsgd.bench import throughput
    compute = {"t_comp": 0.01, "parameter_arrays": 2, "parameter_bytes": M}
    cores = [{"worker": 0.75, "server": 0.25}, {"worker": 1.5, "server": 0.5}]
    runs = []
    for topology in ("hosts", "loopback"):
        args = argparse.Namespace(workers=2, servers=1, batch_size=100, topology=topology,
                                  model="mlp", mlp_hidden=8, dense_layers=1, dense_width=1,
                                  image_size=8, cores=2)
        for bandwidth in (B_MBIT, 0):
            runs += throughput._summarise(
                args, bandwidth, {"dist_sync": [10000.0, 4000.0],
                                  "dist_odsgd": [10000.0, 4000.0]},
                compute, 0.02, [], {"dist_sync": cores, "dist_odsgd": cores})
    od = {(r["topology"], r["bandwidth_mbit"]): r for r in runs if r["mode"] == "dist_odsgd"}
    hosts, loopback = od[("hosts", B_MBIT)], od[("loopback", B_MBIT)]
    assert hosts["cpu_seconds_per_step"] == pytest.approx(0.06)
    assert hosts["predicted_t_comp"] == pytest.approx(0.03)
    link = 0.016 * 1514 / 1448.0
    assert (hosts["predicted_push_seconds"], hosts["predicted_pull_seconds"]) == \
        (pytest.approx(link), pytest.approx(link))
    assert hosts["predicted_step_seconds"] == pytest.approx((2 * link + 0.03) / 2)
    assert hosts["predicted_samples_per_sec"] == pytest.approx(200 / ((2 * link + 0.03) / 2))
    assert loopback["predicted_step_seconds"] == pytest.approx(0.032)
    assert loopback["predicted_samples_per_sec"] == pytest.approx(6250)
    assert "predicted_samples_per_sec" not in od[("hosts", 0)]
    assert "predicted_samples_per_sec" not in od[("loopback", 0)]
    assert all("predicted_samples_per_sec" not in r for r in runs if r["mode"] == "dist_sync")
    # t_comp alone where no CPU figure exists, or where it is the larger
    assert throughput.model_compute_seconds(0.01) == 0.01
    assert throughput.model_compute_seconds(0.05, 0.06, 2) == 0.05
    throughput.print_table(runs[:4])             # hosts, shaped and unshaped
    table = capsys.readouterr().out
    assert "predicted" in next(line for line in table.splitlines() if "x bound" in line)
    row = next(line for line in table.splitlines()
               if "dist_odsgd" in line and "Mbit/s" in line)
    # 6303.3 predicted; median 7000 measured: 7000 * 0.03173 / 200 = 1.11 of it
    step = (2 * link + 0.03) / 2
    assert "%.1f" % (200 / step) in row and row.split()[-1] == "%.2f" % (7000 * step / 200)
    assert "T = max(t_comp, t_link, (push + s * pull + t_comp) / 2) = 31.7 ms (t_comp 30.0 " \
        "ms, t_link 16.7 ms, push 16.7 ms, pull 16.7 ms, s 1.00; payload 0.956 of R" in table


def namespaces():
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return {line.split()[0] for line in out.splitlines() if line.strip()}


def test_throughput_benchmark_tiny(tmp_path):
    out = tmp_path / "tp.json"
    command = [sys.executable, "-m", "odsgd.bench", "throughput", "--mlp-hidden", HIDDEN,
               "--batch-size", 16, "--workers", WORKERS, "--bandwidth-mbit", "0,%d" % BANDWIDTH,
               "--steps", 10, "--skip", 2, "--repeats", 1, "--warmup-steps", 1, "--overlap-interval", 2, "--json", out, "--timeout", 150]
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
    # The bound's fields: the link of the one shaped loopback queue (2 N M / B, whatever the
    # duplex), the CPU bound beside it, and "x bound" against min(CPU, link).
    assert "link bnd" in run.stdout and "CPU bnd" in run.stdout and "x bound" in run.stdout
    for r in runs:
        assert (r["topology"], r["workers"], r["servers"]) == ("loopback", WORKERS, 1)
        assert r["parameter_bytes"] == 4 * mlp_parameter_count(HIDDEN)
        assert r["link_formula"] == "2*N*M/R" and r["link_duplex"] == "full"
        if r["bandwidth_mbit"] == 0:
            assert r["link_bytes_per_sec"] is None and r["wire_seconds"] is None
            assert r["link_bound_samples_per_sec"] is None
            assert r["bound_samples_per_sec"] == r["cpu_bound_samples_per_sec"]
            continue
        assert r["link_bytes_per_sec"] == BANDWIDTH * 1e6 / 8
        assert r["wire_seconds"] == pytest.approx(step_bits / (BANDWIDTH * 1e6))
        assert r["half_duplex_wire_seconds"] == pytest.approx(r["wire_seconds"])
        assert r["link_bound_samples_per_sec"] == pytest.approx(
            WORKERS * 16 / r["wire_seconds"])
        assert r["half_duplex_link_bound_samples_per_sec"] == pytest.approx(
            r["link_bound_samples_per_sec"])
        assert r["bound_samples_per_sec"] == pytest.approx(min(
            r["cpu_bound_samples_per_sec"], r["link_bound_samples_per_sec"]))
    # dist_odsgd's step model beside its measured rate, shaped only (closed form above)
    for r in runs:
        if r["mode"] == "dist_odsgd" and r["bandwidth_mbit"] == BANDWIDTH:
            t_comp = max(r["t_comp"], r["cpu_seconds_per_step"] / r["cores"])
            one_way = WORKERS * r["parameter_bytes"] / r["link_bytes_per_sec"]
            share = r["largest_key_share"]
            assert 0 < share <= 1
            assert r["predicted_samples_per_sec"] == pytest.approx(
                WORKERS * 16 / max(t_comp, 2 * one_way, (one_way + share * one_way + t_comp) / 2))
        else:
            assert "predicted_samples_per_sec" not in r
    od = next(r for r in runs if r["mode"] == "dist_odsgd" and r["bandwidth_mbit"] == 0)
    assert od["overlap_mean_wait_s"] >= 0 and 0 <= od["overlap_hidden_fraction"] <= 1
    assert (tmp_path / "tp.png").stat().st_size > 10000    # the plot
    # the benchmark's namespaces (named after its pid) are gone; others' may come and go
    assert [n for n in namespaces() if n.startswith("odsgd-%d-" % process.pid)] == []
