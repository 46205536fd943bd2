"""ODSGD_TIMELINE recording (odsgd/worker/trace.py) and `python -m odsgd.bench timeline`: the
trace parser on a hand-written Chrome trace, steps and windows on made-up events, and real
jobs whose workers record MXNet's profiler."""
import json
import os
import signal
import subprocess
import sys

import pytest

from odsgd.common import config
from odsgd.worker import trace as tl

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _environment(**extra):
    env = dict(os.environ)
    env.pop("ODSGD_TIMELINE", None)
    env["PYTHONPATH"] = REPO + os.pathsep + env.get("PYTHONPATH", "")
    env.setdefault("OMP_NUM_THREADS", "1")
    env.update(extra)
    return env


def _run(command, timeout, env, cwd=REPO):
    """Runs `command` in a session of its own; on timeout ends exactly that group (by the
    pid it started) and fails with the output."""
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True, env=env, cwd=cwd, start_new_session=True)
    try:
        output, _ = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.send_signal(signal.SIGTERM)   # odsgd.launch ends its own job on SIGTERM
        try:
            output, _ = process.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            output, _ = process.communicate()
        pytest.fail("%s timed out:\n%s" % (" ".join(command), output[-4000:]))
    return process.returncode, output


# -- recording switch ---------------------------------------------------------------------
@pytest.mark.timeout(30)
def test_trace_file_names(tmp_path):
    assert tl.trace_file("out/t.json", 1) == "out/t.rank1.json"
    assert tl.trace_file("out/t", 0) == "out/t.rank0.json"
    assert tl.trace_file("out/tl/", 2) == os.path.join("out/tl/", "timeline.rank2.json")
    assert tl.trace_file(str(tmp_path), 3) == str(tmp_path / "timeline.rank3.json")


@pytest.mark.timeout(30)
def test_nothing_happens_without_the_variable(tmp_path, monkeypatch):
    monkeypatch.delenv("ODSGD_TIMELINE", raising=False)
    monkeypatch.chdir(tmp_path)
    assert config.timeline_path() is None
    assert config.timeline_path({"ODSGD_TIMELINE": "  "}) is None
    assert config.timeline_path({"ODSGD_TIMELINE": "a.json"}) == "a.json"
    assert tl.start_if_asked(0) is None
    assert tl.start_if_asked(0, environ={"ODSGD_TIMELINE": ""}) is None
    assert tl._recording["file"] is None
    assert tl.stop_and_dump() is None
    assert os.listdir(str(tmp_path)) == []


@pytest.mark.timeout(60)
def test_a_process_writes_its_trace_at_exit(tmp_path):
    """One process, no job: start_if_asked, one operation, exit; the atexit dump holds it."""
    script = ("import mxnet as mx\nfrom odsgd.worker import trace as timeline\n"
              "first = timeline.start_if_asked(3)\n"
              "assert timeline.start_if_asked(3) == first\n"
              "(mx.nd.ones((1000,)) * 2).wait_to_read()\n")
    target = tmp_path / "sub" / "t.json"
    code, output = _run([sys.executable, "-c", script], 50,
                        _environment(ODSGD_TIMELINE=str(target)))
    assert code == 0, output
    events = tl.read_trace(str(tmp_path / "sub" / "t.rank3.json"))
    assert [e.kind for e in events if e.name == "_mul_scalar"] == ["compute"]


# -- the parser ---------------------------------------------------------------------------
def _hand_written_trace():
    """Two workers' worth of MXNet's ways in one trace: duration pairs written together
    (also when they overlap on one thread, as the kvstore's asynchronous operations do), a
    complete ('X') event, the async duplicates MXNet also writes, C-API and counter events."""
    def pair(name, begin, end, pid=0, tid=7):
        return [{"name": name, "cat": "operator", "ph": "B", "ts": begin, "pid": pid,
                 "tid": tid},
                {"name": name, "cat": "operator", "ph": "E", "ts": end, "pid": pid,
                 "tid": tid}]
    events = [{"ph": "M", "name": "process_name", "pid": 0, "args": {"name": "cpu/0"}}]
    events += pair("Activation,FullyConnected,Activation", 1000000, 1002000)
    events += pair("_backward_Activation,_backward_FullyConnected", 1002500, 1004000)
    events += pair("KVStoreDistDefaultPush", 1004100, 1009000, pid=2, tid=9)
    events += pair("KVStoreDistDefaultPush", 1004200, 1006000, pid=2, tid=9)
    events += pair("KVStoreDistDefaultStoragePull", 1009100, 1012000, pid=2, tid=9)
    events += pair("KVStoreDistDefaultStoragePushPull", 1012500, 1013500, pid=2, tid=9)
    events.append({"name": "odsgd_multi_predict_update", "cat": "operator", "ph": "X",
                   "ts": 1006100, "dur": 300, "pid": 0, "tid": 7})
    events += pair("CopyCPU2CPU", 1006500, 1006600)
    events += pair("odsgd_gather", 1006600, 1006650)
    events += pair("DeleteVariable", 1006700, 1006710)
    # ignored: MXNet's async duplicate, a C-API call, a counter, an end without a begin
    events += [{"name": "CopyCPU2CPU", "cat": "operator", "ph": "b", "ts": 1006500,
                "id": 7, "pid": 5, "tid": 7},
               {"name": "CopyCPU2CPU", "cat": "operator", "ph": "e", "ts": 1006600,
                "id": 7, "pid": 5, "tid": 7},
               {"name": "MXNDArrayFree", "cat": "MXNET_C_API", "ph": "B", "ts": 1000001,
                "pid": 8, "tid": 7},
               {"name": "MXNDArrayFree", "cat": "MXNET_C_API", "ph": "E", "ts": 1000002,
                "pid": 8, "tid": 7},
               {"name": "Memory: cpu/0", "cat": "Device Storage", "ph": "C",
                "ts": 1000003, "pid": 9, "args": {"Memory": 1}},
               {"name": "mean", "cat": "operator", "ph": "E", "ts": 1000004, "pid": 0,
                "tid": 7}]
    return {"traceEvents": events, "displayTimeUnit": "ms"}


@pytest.mark.timeout(30)
def test_read_trace(tmp_path):
    path = tmp_path / "t.json"
    path.write_text(json.dumps(_hand_written_trace()))
    got = [(e.name, e.kind, e.start_s, e.end_s) for e in tl.read_trace(str(path))]
    expected = [
        ("Activation,FullyConnected,Activation", "compute", 1.0, 1.002),
        ("_backward_Activation,_backward_FullyConnected", "compute", 1.0025, 1.004),
        ("KVStoreDistDefaultPush", "push", 1.0041, 1.009),
        ("KVStoreDistDefaultPush", "push", 1.0042, 1.006),
        ("odsgd_multi_predict_update", "local_update", 1.0061, 1.0064),
        ("CopyCPU2CPU", "copy", 1.0065, 1.0066),
        ("odsgd_gather", "copy", 1.0066, 1.00665),
        ("DeleteVariable", "other", 1.0067, 1.00671),
        ("KVStoreDistDefaultStoragePull", "pull", 1.0091, 1.012),
        ("KVStoreDistDefaultStoragePushPull", "pushpull", 1.0125, 1.0135),
    ]
    assert [g[:2] for g in got] == [e[:2] for e in expected]
    for g, e in zip(got, expected):
        assert g[2:] == pytest.approx(e[2:], abs=1e-9)


@pytest.mark.timeout(30)
def test_read_trace_refuses_a_broken_file(tmp_path):
    path = tmp_path / "t.json"
    path.write_text('{"traceEvents": [{"name": "x", "ph": "B"')
    with pytest.raises(ValueError, match="not a JSON trace"):
        tl.read_trace(str(path))


@pytest.mark.timeout(30)
@pytest.mark.parametrize("name,kind", [
    ("KVStoreDistDefaultPush", "push"), ("KVStoreDistDefaultStoragePull", "pull"),
    ("KVStoreDistDefaultStoragePushPull", "pushpull"),
    ("odsgd_multi_local_update", "local_update"), ("odsgd_multi_nag_predict_update",
                                                   "local_update"),
    ("odsgd_scatter", "copy"), ("CopyCPU2GPU", "copy"), ("WaitForVar", "other"),
    ("ImperativeBulk", "compute"), ("_backward_Convolution", "compute")])
def test_kinds(name, kind):
    assert tl.kind_of(name) == kind


# -- steps, windows, busy shares ----------------------------------------------------------
def _steps(count=12, slow_after=9):
    """Made-up steps, in whole seconds (exact in binary): step i starts at 10 i (10 more
    from step slow_after + 1 on), forward 0-3, backward `_backward_X` 3-4 and 4-5 and
    `_backward_Y` 5-6, then a push 6-9."""
    events = []
    for i in range(count):
        s = 10 * i + (10 if i > slow_after else 0)
        events.append(tl.Event("fwd", "compute", s, s + 3))
        events.append(tl.Event("_backward_X", "compute", s + 3, s + 4))
        events.append(tl.Event("_backward_X", "compute", s + 4, s + 5))
        events.append(tl.Event("_backward_Y", "compute", s + 5, s + 6))
        events.append(tl.Event("KVStoreDistDefaultPush", "push", s + 6, s + 9))
    return events


@pytest.mark.timeout(30)
def test_step_marks_and_steady_window():
    events = _steps()
    expected = [10 * i + (10 if i > 9 else 0) + 6 for i in range(12)]
    assert tl.step_marks(events) == expected          # gcd(24, 12) = 12 steps
    assert tl.step_marks(events, steps=12) == expected
    with pytest.raises(ValueError, match="do not split"):
        tl.step_marks(events, steps=5)
    # candidate windows start at marks 4, 5, 6 (first third and last step left out):
    # 40, 40 and 50 s long; the median is the one from mark 5 to mark 9
    window = tl.steady_window(expected, 4)
    assert (window.start_s, window.end_s) == (56, 96)
    assert window.marks == expected[5:10]
    # steady run: marks 4 to 10, (116 - 46) s over 6 steps
    assert tl.mean_step_seconds(expected) == pytest.approx(70 / 6)
    with pytest.raises(ValueError, match="needs a longer run"):
        tl.steady_window(expected[:7], 4)
    with pytest.raises(ValueError, match="no backward"):
        tl.step_marks([e for e in events if not e.name.startswith("_backward")])


@pytest.mark.timeout(30)
def test_busy_fraction():
    e = tl.Event
    events = [e("p", "push", 1, 3), e("p", "push", 2, 5), e("p", "push", 8, 12),
              e("pp", "pushpull", 6, 7), e("c", "compute", -5, 0.5), e("l", "pull", 11, 12)]
    # push: (1, 5) and (8, 10) inside the window [0, 10]
    assert tl.busy_fraction(events, ("push",), 0, 10) == pytest.approx(0.6)
    assert tl.busy_fraction(events, ("push", "pushpull"), 0, 10) == pytest.approx(0.7)
    assert tl.busy_fraction(events, ("pull",), 0, 10) == 0.0
    shares = tl.lane_fractions(events, 0, 10)
    assert shares == pytest.approx({"compute": 0.05, "push in flight": 0.7,
                                    "pull in flight": 0.1, "local update": 0.0})
    clipped = tl.in_window(events, 0, 10)
    assert min(x.start_s for x in clipped) == 0 and max(x.end_s for x in clipped) == 10


@pytest.mark.timeout(30)
@pytest.mark.parametrize("argv", [["--window", "0"], ["--modes", "dist_foo"],
                                  ["--out", "t.jpg"], ["--steps", "2", "--skip", "0"],
                                  ["--bandwidth-mbit", "-1"], ["--workers", "0"]])
def test_bad_options_are_refused(argv, capsys):
    from odsgd.bench import timeline as bench
    with pytest.raises(SystemExit) as stop:
        bench.parse_args(argv)
    assert stop.value.code == 2
    assert "error" in capsys.readouterr().err


# -- the server NIC meter -----------------------------------------------------------------
def _counters(times_ms, rate_in, rate_out, origin=1000.0):
    """(time s, rx, tx) at `times_ms` after `origin`, of rates (bytes/ms, functions of the
    ms) integrated exactly per ms: the rates are constant within each whole ms."""
    samples, rx, tx, now = [], 0.0, 0.0, 0
    for t in times_ms:
        while now < t:
            rx, tx, now = rx + rate_in(now), tx + rate_out(now), now + 1
        samples.append((origin + t / 1e3, int(rx), int(tx)))
    return samples


@pytest.mark.timeout(30)
def test_nic_summary_closed_forms():
    """800 Mbit/s = 100,000 bytes per ms. In: the full rate for ms 0-60, idle after. Out: 40%
    of it (below the busy threshold, half the link) for ms 0-40, the full rate for 40-100.
    Sampled at every ms and, the second time, at irregular times that include 40 and 60."""
    from odsgd.bench import nic_meter
    full = 100000
    rate_in = lambda ms: full if ms < 60 else 0                  # noqa: E731
    rate_out = lambda ms: 0.4 * full if ms < 40 else full        # noqa: E731
    for times in (range(0, 101), [0, 3, 4, 11, 25, 40, 41, 58, 60, 77, 90, 100]):
        samples = _counters(times, rate_in, rate_out)
        whole = nic_meter.nic_summary(samples, 800)
        assert whole["window_s"] == pytest.approx(0.1)
        assert (whole["in_busy"], whole["out_busy"], whole["both_busy"]) == \
            (pytest.approx(0.6), pytest.approx(0.6), pytest.approx(0.2))
        assert whole["in_mbit"] == pytest.approx(800 * 0.6)
        assert whole["out_mbit"] == pytest.approx(800 * (0.4 * 0.4 + 0.6))
        # ms 30-80: in busy 30-60, out 40-80, both 40-60, of 50 ms
        part = nic_meter.nic_summary(samples, 800, 1000.030, 1000.080)
        assert (part["in_busy"], part["out_busy"], part["both_busy"]) == \
            (pytest.approx(0.6), pytest.approx(0.8), pytest.approx(0.4))
        # past the samples: uncovered time is idle (ms 50-150: in 10, out 50, both 10)
        late = nic_meter.nic_summary(samples, 800, 1000.050, 1000.150)
        assert (late["in_busy"], late["out_busy"], late["both_busy"]) == \
            (pytest.approx(0.1), pytest.approx(0.5), pytest.approx(0.1))
    # every ms sampled: a window that cuts intervals counts their parts (ms 30.5-50.5)
    samples = _counters(range(0, 101), rate_in, rate_out)
    cut = nic_meter.nic_summary(samples, 800, 1000.0305, 1000.0505)
    assert (cut["in_busy"], cut["out_busy"], cut["both_busy"]) == \
        (pytest.approx(1.0), pytest.approx(10.5 / 20), pytest.approx(10.5 / 20))
    # at 1000 Mbit/s the threshold is 62,500 bytes per ms: the 40% out (40,000) stays idle,
    # and at 2000 Mbit/s (125,000) nothing is busy
    assert nic_meter.nic_summary(samples, 1000)["out_busy"] == pytest.approx(0.6)
    assert nic_meter.nic_summary(samples, 2000)["in_busy"] == 0.0
    unshaped = nic_meter.nic_summary(samples, 0)
    assert unshaped["in_busy"] is None and unshaped["both_busy"] is None
    assert unshaped["in_mbit"] == pytest.approx(480)
    assert "in busy 60%, out busy 60%, both 20%" in nic_meter.summary_line(
        nic_meter.nic_summary(samples, 800))
    with pytest.raises(ValueError):
        nic_meter.nic_summary(samples[:1], 800)


@pytest.mark.timeout(30)
def test_server_nic_meter_reads_a_namespaces_counters():
    """The meter on this process's own namespace, interface lo: 2 MB sent to ourselves over
    TCP show in its counters, in both directions (lo receives what it sends), on the clock
    of time.time()."""
    import socket
    import time
    from odsgd.bench import nic_meter
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    client = socket.create_connection(server.getsockname())
    peer, _ = server.accept()
    before = time.time()
    with nic_meter.ServerNICMeter(os.getpid(), interface="lo", interval=0.003) as meter:
        time.sleep(0.05)
        client.sendall(b"x" * 2000000)
        got = 0
        while got < 2000000:
            got += len(peer.recv(1 << 20))
        time.sleep(0.05)
    for s in (client, peer, server):
        s.close()
    samples = meter.samples
    assert meter.error is None and len(samples) >= 20
    assert before <= samples[0][0] and samples[-1][0] <= time.time()
    assert [t for t, _, _ in samples] == sorted(t for t, _, _ in samples)
    assert samples[-1][1] - samples[0][1] >= 2000000          # rx
    assert samples[-1][2] - samples[0][2] >= 2000000          # tx
    with pytest.raises(ValueError, match="no interface"):
        nic_meter.read_counters(os.getpid(), "no-such-nic0")


@pytest.mark.timeout(30)
def test_a_pushpull_is_one_bar_across_both_lanes(tmp_path):
    """The picture's panel of a made-up worker: a pushpull spans the push and the pull lanes
    in one bar; a push and a pull stay in their own lane; the server NIC rows come last."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from odsgd.bench import timeline as bench
    events = [{"name": "p", "kind": "pushpull", "start_ms": 1.0, "end_ms": 3.0},
              {"name": "u", "kind": "push", "start_ms": 4.0, "end_ms": 5.0},
              {"name": "l", "kind": "pull", "start_ms": 6.0, "end_ms": 7.0}]
    result = {"ranks": [{"rank": 0, "events": events}], "marks_ms": [0.0, 8.0],
              "mean_step_ms": 8.0, "window_ms": 8.0,
              "busy": {"compute": 0.0, "push in flight": 0.375, "pull in flight": 0.375,
                       "local update": 0.0},
              "server_nic": {"in_busy": 0.5, "out_busy": 0.25, "both_busy": 0.0,
                             "rates": [[0.0, 4.0, 800.0, 0.0], [4.0, 8.0, 0.0, 400.0]]}}
    fig, ax = plt.subplots()
    bench._panel(ax, "dist_odsgd", result, link_mbit=800)
    labels = [t.get_text() for t in ax.get_yticklabels()]
    assert labels == ["w0 compute", "w0 push in flight", "w0 pull in flight",
                      "w0 local update", "server NIC in", "server NIC out"]
    bars = {}
    for collection in ax.collections:
        for path in collection.get_paths():
            box = path.get_extents()
            bars.setdefault((round(box.x0, 3), round(box.x1, 3)), []).append(
                (round(box.y0, 3), round(box.y1, 3)))
    assert bars[(1.0, 3.0)] == [(-2.38, -0.62)]         # one bar: pull lane to push lane
    assert bars[(4.0, 5.0)] == [(-1.38, -0.62)]         # push lane
    assert bars[(6.0, 7.0)] == [(-2.38, -1.62)]         # pull lane
    title = ax.get_title(loc="left")
    assert title.startswith("dist_odsgd: step 8.0 ms; busy: compute 0%, push 38%")
    assert title.endswith("; server NIC busy: in 50%, out 25%, both 0%")
    plt.close(fig)


# -- real jobs ----------------------------------------------------------------------------
MLP_ARRAYS = 6      # Dense(h) -> Dense(h) -> Dense(10): a weight and a bias each


@pytest.mark.timeout(120)
def test_throughput_job_records_every_push_and_pull(tmp_path):
    """A 2-worker dist_sync job of the throughput benchmark: each worker's trace holds, per
    step, one pushpull per parameter array (Gluon's Trainer under dist_sync), and from the
    Trainer's start rank 0's init pushes and every worker's broadcast pulls, one per array."""
    from odsgd.bench.jobs import run_job
    skip, steps = 2, 4
    out = tmp_path / "job"
    out.mkdir()
    run_job(["odsgd.bench.throughput_job", "--kvstore", "dist_sync", "--mlp-hidden", 16,
             "--batch-size", 8, "--skip", skip, "--steps", steps, "--out", str(out)],
            workers=2, servers=1, timeout=90, stall_timeout=60,
            env={"ODSGD_TIMELINE": str(out / "trace.json"), "OMP_NUM_THREADS": "1"})
    for rank in range(2):
        events = tl.read_trace(str(out / ("trace.rank%d.json" % rank)))
        count = {kind: sum(1 for e in events if e.kind == kind) for kind in tl.KINDS}
        assert count["pushpull"] == (skip + steps) * MLP_ARRAYS
        assert count["pull"] == MLP_ARRAYS
        assert count["push"] == (MLP_ARRAYS if rank == 0 else 0)
        assert all(e.end_s >= e.start_s for e in events)
        assert len(tl.step_marks(events)) == skip + steps


@pytest.mark.timeout(150)
def test_bench_timeline_draws_every_mode(tmp_path):
    png, data = tmp_path / "t.png", tmp_path / "t.json"
    code, output = _run([sys.executable, "-m", "odsgd.bench", "timeline", "--mlp-hidden", "16",
                         "--batch-size", "8", "--skip", "2", "--steps", "8",
                         "--out", str(png), "--json", str(data)], 140, _environment())
    assert code == 0, output
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    result = json.loads(data.read_text())
    assert list(result["modes"]) == ["dist_sync", "dist_async", "dist_odsgd"]
    for mode, entry in result["modes"].items():
        assert mode in output
        assert entry["window_ms"] > 0 and len(entry["marks_ms"]) == 5
        assert [r["rank"] for r in entry["ranks"]] == [0, 1]
        for share in entry["busy"].values():
            assert 0.0 <= share <= 1.0
        kinds = {e["kind"] for r in entry["ranks"] for e in r["events"]}
        if mode == "dist_odsgd":
            # separate pushes and pulls, or push-with-pull requests (kv.pushpull)
            assert {"compute", "local_update"} <= kinds
            assert {"push", "pull"} <= kinds or "pushpull" in kinds
        else:
            assert {"compute", "pushpull"} <= kinds
        assert "server_nic" not in entry                    # loopback: no NIC of a server
    assert "server NIC" not in output


def _no_emulation():
    from odsgd.cluster import emulate
    try:
        emulate.require_root_and_sshd()
    except emulate.EmulationError as error:
        return str(error)
    return None


@pytest.mark.timeout(150)
@pytest.mark.skipif(_no_emulation() is not None, reason=str(_no_emulation()))
def test_bench_timeline_on_hosts_records_the_server_nic(tmp_path):
    """Emulated hosts at 200 Mbit/s, a 0.33 M-parameter MLP (1.3 MB a push): the first
    server's NIC is busy in both directions for part of the window, its mean rate in and
    out cannot pass the link's (5% for the token bucket's burst), and the pushes of one
    step's 2 workers (2 x 1.3 MB in) take at least 2 x 1.3 MB / 25 MB/s = 106 ms of it."""
    from odsgd.bench.throughput_job import mlp_parameter_count
    png, data = tmp_path / "t.png", tmp_path / "t.json"
    code, output = _run([sys.executable, "-m", "odsgd.bench", "timeline", "--topology",
                         "hosts", "--bandwidth-mbit", "200", "--modes", "dist_odsgd",
                         "--mlp-hidden", "256", "--batch-size", "8", "--skip", "2",
                         "--steps", "8", "--out", str(png), "--json", str(data)], 140,
                        _environment())
    assert code == 0, output
    assert "dist_odsgd  server NIC: in busy" in output
    nic = json.loads(data.read_text())["modes"]["dist_odsgd"]["server_nic"]
    assert nic["link_mbit"] == 200 and nic["samples"] >= 20
    for direction in ("in", "out"):
        assert 0.05 < nic[direction + "_busy"] <= 1.0
        assert 0 < nic[direction + "_mbit"] <= 1.05 * 200
    assert 0.0 <= nic["both_busy"] <= min(nic["in_busy"], nic["out_busy"])
    window_ms = json.loads(data.read_text())["modes"]["dist_odsgd"]["window_ms"]
    step_bytes = 2 * 4 * mlp_parameter_count(256)               # two workers' pushes
    assert window_ms / 4 >= 0.95 * 1e3 * step_bytes / (200e6 / 8)
    assert nic["rates"][0][0] == 0.0 and nic["rates"][-1][1] == pytest.approx(window_ms)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # TCP's and the shapers' counters of the job, per step: segments went out, none negative
    tcp = json.loads(data.read_text())["modes"]["dist_odsgd"]["tcp_per_step"]
    assert tcp["segments_sent"] > 0 and min(tcp.values()) >= 0
    assert "dist_odsgd  TCP per step:" in output


# -- answers' spread across workers (odsgd.bench rounds) --------------------------------------
def _requests(spans):
    """Events of push-with-pull requests, (start, end) each, written out of order."""
    return [tl.Event("KVStoreDistDefaultStoragePushPull", "pushpull", a, b)
            for a, b in reversed(spans)] + [tl.Event("Convolution", "compute", 0.0, 9.0)]


def test_answer_spread_worked_by_hand():
    """2 workers, rounds of 2 parts. Round 0: worker 0 issues at 0.0 / 0.1, answers at 1.0 /
    1.5; worker 1 issues at 0.2 / 0.3, answers at 1.2 / 1.6: part spreads 0.2 and 0.1
    (median 0.15, max 0.2), last answers 1.5 and 1.6 (0.1 apart), round trip 1.6 - 0.0.
    Round 1: answers 3.0 / 3.9 and 3.0 / 3.1: spreads 0.0 and 0.8, last answers 0.8 apart,
    round trip 3.9 - 2.0."""
    w0 = _requests([(0.0, 1.0), (0.1, 1.5), (2.0, 3.0), (2.1, 3.9)])
    w1 = _requests([(0.2, 1.2), (0.3, 1.6), (2.2, 3.0), (2.3, 3.1)])
    rounds = tl.answer_spread([w0, w1], parts=2)
    expected = [dict(part_spread_median=0.15, part_spread_max=0.2, last_answer_spread=0.1,
                     round_trip=1.6),
                dict(part_spread_median=0.4, part_spread_max=0.8, last_answer_spread=0.8,
                     round_trip=1.9)]
    assert len(rounds) == 2
    for got, want in zip(rounds, expected):
        assert got == pytest.approx(want)


def test_answer_spread_refuses_rounds_that_do_not_split():
    w0 = _requests([(0.0, 1.0), (0.1, 1.5), (2.0, 3.0)])
    with pytest.raises(ValueError, match="do not split into rounds of 2 parts"):
        tl.answer_spread([w0, w0], parts=2)
    w1 = _requests([(0.0, 1.0), (0.1, 1.5)])
    with pytest.raises(ValueError, match="different numbers of rounds"):
        tl.answer_spread([_requests([(0, 1), (1, 2), (2, 3), (3, 4)]), w1], parts=2)


def test_rounds_command_on_written_traces(tmp_path, capsys):
    """The command reads a folder of traces as MXNet's profiler writes them (B/E pairs) and
    prints the steady rounds' medians: 6 rounds, the first 2 (a third) and the last left
    out, leaving rounds 2-4, whose round trips are 1.0 + r/10 s with worker 1's answers r/10
    s after worker 0's."""
    from odsgd.bench import rounds as rounds_command
    for rank in range(2):
        raw = []
        for r in range(6):
            start, end = 10.0 * r, 10.0 * r + 1.0 + (r / 10.0 if rank else 0.0)
            raw += [{"name": "KVStoreDistDefaultStoragePushPull", "cat": "operator",
                     "ph": ph, "ts": ts * 1e6, "pid": 0, "tid": 1}
                    for ph, ts in (("B", start), ("E", end))]
        (tmp_path / ("timeline.rank%d.json" % rank)).write_text(json.dumps({"traceEvents": raw}))
    out = tmp_path / "rounds.json"
    assert rounds_command.main([str(tmp_path), "--parts", "1", "--json", str(out)]) == 0
    # run again: the JSON it wrote beside the traces is not taken for a trace
    assert rounds_command.main([str(tmp_path), "--parts", "1", "--json", str(out)]) == 0
    steady = json.loads(out.read_text())["steady"]
    assert steady["rounds"] == 3
    assert steady["round_trip"] == pytest.approx(1.3)
    assert steady["last_answer_spread"] == pytest.approx(0.3)
    assert "the last answers 300 ms apart" in capsys.readouterr().out
