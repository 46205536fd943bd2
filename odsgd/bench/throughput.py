"""`python -m odsgd.bench throughput`: dist_sync, dist_async and dist_odsgd side by side on
an emulated cluster network.

For each bandwidth (Mbit/s of a token-bucket-shaped loopback in a network namespace of its
own; 0 = unshaped) it measures:

* samples/s of each mode (summed over workers; median, min and max over --repeats, the modes
  interleaved within each repeat so that drift on a shared machine hits all alike);
* t_comp, one step's forward/backward alone (one process, no kvstore), and t_comm, one step's
  push + pull of every parameter with no computation (a dist_sync job under that bandwidth);
* the bounds: SSGD = N B / (t_comp + t_comm), ideal overlap = N B / max(t_comp, t_comm);
* dist_odsgd's own overlap meter: the mean time its local update waited for the previous pull,
  and the share of t_comm hidden, 1 - wait / t_comm;
* the CPU each mode used: every process's CPU seconds in the timed window (odsgd.bench.cpu_meter,
  from /proc), per role, as cores in use and CPU seconds per step;
* the bounds of each mode: the CPU bound, samples/s x cores / cores in use (cores over the CPU
  seconds of a step); the link bound, N B / t_link, t_link being one step's bytes through the
  busiest shaped queue over its rate R (--bandwidth-mbit / 8 bytes/s; on --topology hosts one
  direction of a full-duplex NIC: max(M / R, N M / (S R)), M the parameters' bytes, S the
  servers; on the one shaped loopback 2 N M / R, as that one queue carries every push and
  every pull); and the bound min(CPU bound, link bound), which "x bound" compares against, so
  that a mode that is below its ideal shows whether the CPU or the network holds it back. The
  JSON also keeps the half-duplex figures (half_duplex_*: a NIC's pushes and pulls counted on
  one medium, the two-direction count of earlier versions);
* for every mode, the rate the step model of odsgd/bench/step_model.py predicts
  (plan_samples_per_sec, the planner's model: dist_sync t_comp + max(push + s * pull,
  t_link), dist_async t_comp + t_link, dist_odsgd max(t_comp, t_link, (push + s * pull +
  t_comp) / 2), s the largest server key's share of the parameters, the link's times at the
  share of R that TCP's payload fills on hosts (step_model.payload_share); unshaped the link
  terms are 0), and for dist_odsgd on a shaped link the same as predicted_samples_per_sec.

With --device-profile or --compute-ms the workers are accelerator-paced
(odsgd/bench/paced.py): they wait the accelerator's step time instead of computing, and
exchange the real parameter shapes of --model, scaled down with the link by --byte-scale.

Writes a table to the console, --json FILE (key "runs", one entry per mode and bandwidth) and
a PNG plot beside it.
"""
import argparse
import contextlib
import json
import os
import statistics
import sys
import tempfile
import time

from . import device_profiles, nic_meter, paced, tcp_counters
from .cpu_meter import JobCPUMeter
from ..cluster.emulate import CONGESTION
from .jobs import (TOPOLOGIES, TOPOLOGY_HELP, JobFailed, job_environment, job_placement,
                   link_bytes_per_sec, link_step_seconds, run_job, step_wire_bytes,
                   tcp_congestion)
from .model_shapes import scaled_sizes
# The step model's formulas, named here too for the code and tests that know them here.
from .step_model import (LINK_FORMULA, MODES, largest_key_share, link_times,  # noqa: F401
                         mode_shares, model_compute_seconds, odsgd_step_seconds,
                         predict_modes, predicted_samples_per_sec, push_pull_seconds,
                         spread_workers, topology_payload_share)
from .throughput_job import MODEL_HELP


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="odsgd.bench throughput", description=__doc__)
    p.add_argument("--model", default="mlp", help=MODEL_HELP)
    p.add_argument("--batch-size", type=int, default=128, help="per worker")
    p.add_argument("--image-size", type=int, default=224, help="for the ResNets")
    p.add_argument("--mlp-hidden", type=int, default=1024,
                   help="hidden units of 'mlp' (1024: 2.1 M parameters)")
    p.add_argument("--dense-layers", type=int, default=81,
                   help="layers of 'dense' (81: 162 parameter arrays)")
    p.add_argument("--dense-width", type=int, default=16, help="units per layer of 'dense'")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--servers", type=int, default=1)
    p.add_argument("--bandwidth-mbit", default="0,1000,2000,4000",
                   help="comma-separated list; 0 = unshaped loopback")
    p.add_argument("--topology", choices=TOPOLOGIES, default="loopback", help=TOPOLOGY_HELP)
    p.add_argument("--tcp-congestion", default=CONGESTION,
                   help="TCP congestion control between emulated hosts (--topology hosts; "
                        "default %(default)s, Linux's; 'default': this kernel's own)")
    p.add_argument("--steps", type=int, default=30, help="timed steps per run")
    p.add_argument("--skip", type=int, default=8, help="untimed steps before timing")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--modes", default=",".join(MODES))
    p.add_argument("--warmup-steps", type=int, default=2,
                   help="dist_odsgd's SSGD warm-up (ODSGD_WARMUP_STEPS); timing starts after "
                        "--skip steps, so keep it below that to time the OD phase")
    p.add_argument("--overlap-interval", type=int, default=10,
                   help="dist_odsgd measures its overlap every this many steps "
                        "(ODSGD_METRICS_INTERVAL), in 2 x that many steps after the timed "
                        "window: a sampled step blocks the worker; 0: not measured")
    p.add_argument("--omp-threads", type=int, default=1,
                   help="OMP_NUM_THREADS of every process (1: one core per worker)")
    p.add_argument("--timeout", type=int, default=900, help="seconds per job")
    p.add_argument("--stall-timeout", type=int, default=60,
                   help="end a job that prints nothing for this many seconds (jobs print "
                        "progress every 5 s)")
    p.add_argument("--cores", type=int, default=len(os.sched_getaffinity(0)),
                   help="cores the job has, for the CPU bound (default: this process's)")
    _add_paced_options(p)
    p.add_argument("--json", default="runs/throughput.json")
    p.add_argument("--plot", default=None, help="PNG path (default: beside --json)")
    args = p.parse_args(argv)
    _check_paced(p, args)
    args.bandwidths = [int(b) for b in args.bandwidth_mbit.split(",") if b.strip() != ""]
    args.mode_list = [m.strip() for m in args.modes.split(",") if m.strip()]
    for mode in args.mode_list:
        if mode not in MODES:
            p.error("unknown mode %r; choose from %s" % (mode, ", ".join(MODES)))
    if min(args.bandwidths) < 0:
        p.error("--bandwidth-mbit values must be >= 0")
    return args


def _add_paced_options(parser):
    parser.add_argument("--device-profile", default=None,
                        help="accelerator-paced workers: wait this accelerator's step time "
                             "for --model at --batch-size instead of computing (%s; "
                             "odsgd/bench/device_profiles.py)" % device_profiles.DEVICE_NAMES)
    parser.add_argument("--compute-ms", type=float, default=None,
                        help="accelerator-paced workers: wait this many ms per step instead "
                             "of computing (wins over --device-profile's step time)")
    parser.add_argument("--byte-scale", type=int, default=1,
                        help="accelerator-paced workers: every array's element count and the "
                             "link's rate divided by this (the --bandwidth-mbit values stay "
                             "the cluster's; the store's size settings are divided too)")


def _check_paced(parser, args):
    """Sets args.paced and, from --device-profile, args.compute_ms; refuses what a paced run
    cannot do (a model without a shapes table, a byte scale without pacing)."""
    args.paced = args.device_profile is not None or args.compute_ms is not None
    if not args.paced:
        if args.byte_scale != 1:
            parser.error("--byte-scale scales the arrays of an accelerator-paced worker; add "
                         "--device-profile or --compute-ms (a computed model's arrays are "
                         "its own)")
        return
    try:
        scaled_sizes(args.model, args.byte_scale)
        if args.device_profile is not None:
            step = device_profiles.step_seconds(args.model, args.device_profile,
                                                args.batch_size)
            args.compute_ms = 1e3 * step if args.compute_ms is None else args.compute_ms
    except ValueError as refusal:
        parser.error(str(refusal))
    if args.compute_ms < 0:
        parser.error("--compute-ms must be >= 0, got %g" % args.compute_ms)


def shaped_mbit(args, bandwidth):
    """The rate a link of `bandwidth` Mbit/s (the cluster's) is shaped to: divided by the
    byte scale, as the arrays are."""
    return bandwidth / float(getattr(args, "byte_scale", 1))


def _job_args(args, out, **extra):
    job = ["odsgd.bench.throughput_job", "--model", args.model, "--batch-size",
           args.batch_size, "--image-size", args.image_size, "--mlp-hidden", args.mlp_hidden,
           "--dense-layers", args.dense_layers, "--dense-width", args.dense_width,
           "--steps", args.steps,
           "--skip", args.skip, "--out", out]
    if getattr(args, "compute_ms", None) is not None:
        job += ["--compute-ms", args.compute_ms, "--byte-scale", args.byte_scale]
    for key, value in extra.items():
        job += ["--" + key.replace("_", "-"), value]
    return job


def _env(args, mode=None):
    env = {"OMP_NUM_THREADS": str(args.omp_threads)}
    env.update(paced.scaled_store_environment(getattr(args, "byte_scale", 1)))
    if mode == "dist_odsgd":
        env.update(ODSGD_WARMUP_STEPS=str(args.warmup_steps),
                   ODSGD_METRICS_INTERVAL=str(args.overlap_interval))
    return env


def _read_ranks(out, count):
    results = []
    for rank in range(count):
        with open(os.path.join(out, "rank%d.json" % rank)) as f:
            results.append(json.load(f))
    return results


def measure_compute(args):
    """t_comp: one process, no kvstore."""
    import subprocess
    with tempfile.TemporaryDirectory() as out:
        command = [sys.executable, "-m"] + [str(a) for a in _job_args(args, out,
                                                                     measure="compute")]
        subprocess.run(command, check=True, env=job_environment(_env(args)),
                       capture_output=True, text=True, timeout=args.timeout)
        return _read_ranks(out, 1)[0]


def measure_comm(args, place):
    with tempfile.TemporaryDirectory() as out:
        run_job(_job_args(args, out, measure="comm"), args.workers, args.servers,
                args.timeout, env=_env(args), stall_timeout=args.stall_timeout, **place)
        return max(r["t_comm"] for r in _read_ranks(out, args.workers))


def measure_mode(args, mode, place, records=None):
    """(samples/s of the whole job, dist_odsgd overlap summaries or None, {role: cores in
    use during the timed window}, the resolution of that figure in cores). With `records` (a
    list), what the job did besides is appended to it as one dict: on emulated hosts what the
    link did, TCP's and the queues' counters per step (`tcp_per_step`,
    odsgd.bench.tcp_counters) and the first server's NIC over the timed window (`server_nic`,
    odsgd.bench.nic_meter.nic_summary); with paced workers where their steps' time went
    (`paced_phases`: each phase's mean over the workers, odsgd.bench.paced.PHASES, and the
    longest worker's wait for weights)."""
    meter = JobCPUMeter()
    cluster = place.get("hosts") if records is not None else None
    nic = nic_meter.server_nic_meter(place, "throughput") if cluster else None
    with tempfile.TemporaryDirectory() as out, meter, nic or contextlib.nullcontext(), \
            tcp_counters.counting(cluster, args.skip + args.steps) as tcp_per_step:
        env = dict(_env(args, mode), **meter.environment)
        run_job(_job_args(args, out, kvstore=mode), args.workers, args.servers, args.timeout,
                env=env, stall_timeout=args.stall_timeout, **place)
        ranks = _read_ranks(out, args.workers)
    counts = {}
    if cluster:
        counts["tcp_per_step"] = tcp_per_step
        if nic is not None and len(nic.samples) >= 2:
            counts["server_nic"] = nic_meter.nic_summary(nic.samples, cluster.mbit,
                                                         *_common_window(ranks))
    phases = [r["paced_phases"] for r in ranks if r.get("paced_phases")]
    if phases:
        counts["paced_phases"] = dict(
            {name: statistics.mean(p[name] for p in phases) for name in phases[0]},
            wait_weights_max=max(p["wait_weights"] for p in phases))
    if records is not None and counts:
        records.append(counts)
    cores = window_cores(meter, ranks)
    overlap = [r["overlap"] for r in ranks if "overlap" in r]
    return (sum(r["samples_per_sec"] for r in ranks), overlap or None, cores,
            window_resolution(meter, ranks))


def window_cores(meter, ranks):
    """{role: cores in use} over the window all workers were timing in (the latest start to
    the earliest end; where the workers' windows do not overlap, as dist_async's may not on a
    short run, from the earliest start to the latest end): the CPU seconds of every process
    of the job inside it (JobCPUMeter.cpu_in) over its length. The workers' edge samples
    (`cpu_edges` of their results) go to the meter first, so that the window has a sample at
    each edge however short it is. {} for an empty window."""
    for r in ranks:
        meter.add_edge_samples(r.get("cpu_edges"))
    start, end = _common_window(ranks)
    if end <= start:
        return {}
    return {role: cpu / (end - start) for role, cpu in meter.cpu_in(start, end).items()}


def _common_window(ranks):
    """(start, end) of the window all workers were timing in (see window_cores)."""
    start = max(r["window"][0] for r in ranks)
    end = min(r["window"][1] for r in ranks)
    if end <= start:
        start = min(r["window"][0] for r in ranks)
        end = max(r["window"][1] for r in ranks)
    return start, end


def window_resolution(meter, ranks):
    """How far window_cores' total can be off, in cores: /proc counts CPU time in clock ticks,
    so each process's CPU seconds between two samples is off by less than one tick; over a
    window of a few steps that is a visible share (4 processes over 50 ms: 0.8 cores)."""
    start, end = _common_window(ranks)
    if end <= start:
        return None
    return len(meter.samples) / float(os.sysconf("SC_CLK_TCK")) / (end - start)


def run(args):
    compute = measure_compute(args)
    t_comp = compute["t_comp"]
    print("t_comp = %.1f ms per step (%s: %d parameter arrays, %.1f MB; batch %d, one process)"
          % (1e3 * t_comp, args.model, compute["parameter_arrays"],
             compute["parameter_bytes"] / 1e6, args.batch_size), flush=True)
    if args.paced:
        print(_paced_line(_paced_fields(args, args.bandwidths[0])), flush=True)
    runs = []
    for bandwidth in args.bandwidths:
        samples = {mode: [] for mode in args.mode_list}
        cores = {mode: [] for mode in args.mode_list}
        resolutions = {mode: [] for mode in args.mode_list}
        records = {mode: [] for mode in args.mode_list}
        overlaps = []
        with job_placement(args.topology, shaped_mbit(args, bandwidth), args.workers,
                           args.servers, args.tcp_congestion) as place:
            t_comm = measure_comm(args, place)
            print("[%s] t_comm = %.1f ms per step" % (_bw(bandwidth), 1e3 * t_comm), flush=True)
            for repeat in range(args.repeats):
                # Rotate the order so that no mode always runs first or last.
                order = args.mode_list[repeat % len(args.mode_list):] + \
                    args.mode_list[:repeat % len(args.mode_list)]
                for mode in order:
                    tic = time.time()
                    rate, overlap, used, resolution = measure_mode(args, mode, place,
                                                                   records[mode])
                    samples[mode].append(rate)
                    cores[mode].append(used)
                    resolutions[mode].append(resolution)
                    if overlap:
                        overlaps.extend(overlap)
                    print("[%s] repeat %d/%d  %-10s %8.1f samples/s  %.2f cores  (%.0f s)"
                          % (_bw(bandwidth), repeat + 1, args.repeats, mode, rate,
                             sum(used.values()), time.time() - tic), flush=True)
                    for counts in records[mode][-1:]:
                        if "paced_phases" in counts:
                            print("[%s]   %s" % (_bw(bandwidth), paced.phases_line(
                                counts["paced_phases"])), flush=True)
                        if "tcp_per_step" in counts:
                            print("[%s]   TCP %s" % (_bw(bandwidth), tcp_counters.summary_line(
                                counts["tcp_per_step"])), flush=True)
                        if "server_nic" in counts:
                            print("[%s]   %s" % (_bw(bandwidth), nic_meter.summary_line(
                                counts["server_nic"])), flush=True)
        runs.extend(_summarise(args, bandwidth, samples, compute, t_comm, overlaps, cores,
                               resolutions, records))
    return runs


def _bandwidth_order(bandwidth):
    """Sort key: unshaped (0) is the fastest link, so it goes last."""
    return bandwidth or float("inf")


def _bw(bandwidth):
    return "%5d Mbit/s" % bandwidth if bandwidth else "  unshaped  "


def cpu_summary(rates, cores_per_repeat, cores, per_step, wire_seconds,
                half_duplex_wire_seconds=None):
    """CPU and bound fields of one mode: median cores in use per role and in all, CPU seconds
    per step, the CPU bound rate x cores / cores in use, the link bound per_step / wire_seconds
    (one step's time on the link, full duplex; None unshaped) and the bound
    min(CPU bound, link bound), each repeat's from its own rate and CPU, then the median. With
    `half_duplex_wire_seconds`, the same link and combined bounds under the half-duplex
    figure, as half_duplex_*."""
    roles = sorted({role for used in cores_per_repeat for role in used})
    total = [sum(used.values()) for used in cores_per_repeat]
    cpu_bounds = [rate * cores / used for rate, used in zip(rates, total) if used > 0]
    link_bound = per_step / wire_seconds if wire_seconds else None
    half_link_bound = per_step / half_duplex_wire_seconds if half_duplex_wire_seconds else None
    entry = {"cores": cores,
             "cores_in_use": statistics.median(total) if total else None,
             "cores_in_use_by_role": {role: statistics.median(used.get(role, 0.0)
                                                              for used in cores_per_repeat)
                                      for role in roles},
             "link_bound_samples_per_sec": link_bound,
             "half_duplex_link_bound_samples_per_sec": half_link_bound}
    if cpu_bounds:
        entry["cpu_seconds_per_step"] = statistics.median(
            used * per_step / rate for rate, used in zip(rates, total) if rate > 0)
        entry["cpu_bound_samples_per_sec"] = statistics.median(cpu_bounds)
        entry["bound_samples_per_sec"] = combined_bound(cpu_bounds, link_bound)
        entry["half_duplex_bound_samples_per_sec"] = combined_bound(cpu_bounds,
                                                                    half_link_bound)
    else:
        # no CPU figures (the meter saw nothing): the link alone still bounds the rate
        entry["bound_samples_per_sec"] = link_bound
        entry["half_duplex_bound_samples_per_sec"] = half_link_bound
    return entry


def combined_bound(cpu_bounds, link_bound):
    """Median over repeats of min(CPU bound, link bound); the CPU bound alone unshaped."""
    return statistics.median(b if link_bound is None else min(b, link_bound)
                             for b in cpu_bounds)


def link_fields(topology, workers, servers, parameter_bytes, bandwidth):
    """The link's part of a run's JSON: topology, N, S, M (bytes), R (bytes/s per queue, i.e.
    per NIC direction on hosts; None unshaped), the bytes of one step through the busiest
    queue and their time on it, full duplex (the bound) and half duplex (for comparison)."""
    return {"topology": topology, "workers": workers, "servers": servers,
            "parameter_bytes": parameter_bytes,
            "link_bytes_per_sec": link_bytes_per_sec(bandwidth),
            "link_duplex": "full",
            "link_formula": LINK_FORMULA[topology],
            "wire_bytes_per_step": step_wire_bytes(topology, workers, servers,
                                                   parameter_bytes),
            "wire_seconds": link_step_seconds(topology, workers, servers, parameter_bytes,
                                              bandwidth),
            "half_duplex_wire_bytes_per_step": step_wire_bytes(
                topology, workers, servers, parameter_bytes, duplex="half"),
            "half_duplex_wire_seconds": link_step_seconds(
                topology, workers, servers, parameter_bytes, bandwidth, duplex="half")}


def prediction_fields(entry, per_step, bandwidth_mbit):
    """The step model's fields of a dist_odsgd entry (after cpu_summary and link_fields):
    the model's t_comp, push, pull and step time, and predicted_samples_per_sec; {} unshaped
    (no link rate: the model has nothing to add to the CPU bound)."""
    # the link's times with TCP's payload share of the rate (the bound, wire_seconds, counts
    # the payload at the whole rate); all 0 unshaped
    t_link, push, pull = link_times(entry["topology"], entry["workers"], entry["servers"],
                                    entry["parameter_bytes"], bandwidth_mbit)
    if not t_link:
        return {}
    t_comp = model_compute_seconds(entry["t_comp"], entry.get("cpu_seconds_per_step"),
                                   entry.get("cores"))
    share = entry.get("largest_key_share") or 1.0
    step = odsgd_step_seconds(t_comp, t_link, push, pull, share)
    return {"predicted_t_comp": t_comp, "predicted_push_seconds": push,
            "predicted_pull_seconds": pull, "predicted_last_share": share,
            "predicted_step_seconds": step,
            "predicted_formula": "max(t_comp, t_link, (push + s * pull + t_comp) / 2)",
            "predicted_samples_per_sec": per_step / step}


def plan_fields(entry, per_step, bandwidth_mbit, sizes=None, environ=None, shares=None):
    """The step model's prediction for the mode of `entry` (after cpu_summary and
    link_fields; step_model.predict_modes): plan_step_seconds, plan_samples_per_sec,
    plan_binds, plan_share, plan_formula. The computation is the measured t_comp; the job's
    CPU seconds per step over its cores, where measured, bound it too. `sizes`: the arrays'
    elements (for s; without them s = 1), `environ`: the job's store settings; or `shares`,
    {mode: s} as known (odsgd.bench.replan: a recorded run's plan_share)."""
    link = link_times(entry["topology"], entry["workers"], entry["servers"],
                      entry["parameter_bytes"], bandwidth_mbit)
    cpu, cores = entry.get("cpu_seconds_per_step"), entry.get("cores")
    if shares is None:
        shares = mode_shares(sizes, entry["servers"], environ)
    return predict_modes(link, per_step, entry["t_comp"], shares,
                         cpu / cores if cpu and cores else 0.0, modes=[entry["mode"]],
                         spread_workers=spread_workers(entry["topology"], entry["workers"])
                         )[entry["mode"]]


def _paced_fields(args, bandwidth):
    """What an accelerator-paced run records beside its rates (nothing for a computed one):
    the wait per step, the device, the byte scale, the shaped rate, the model's bytes at
    scale 1 and, with a device profile, the local update's estimated time on its GPU."""
    if not getattr(args, "paced", False):
        return {}
    elements = sum(scaled_sizes(args.model, 1))
    fields = {"compute_ms": args.compute_ms, "device_profile": args.device_profile,
              "byte_scale": args.byte_scale, "shaped_mbit": shaped_mbit(args, bandwidth),
              "unscaled_parameter_bytes": 4 * elements, "model_for_shapes": args.model}
    if args.device_profile is not None:
        device = device_profiles.accelerator(args.device_profile)
        fields.update(device=device.description, device_source=device.source,
                      device_step_is_estimate=device_profiles.is_estimate(args.model),
                      local_update_gpu_seconds=device_profiles.local_update_seconds(
                          elements, args.device_profile))
    return fields


def _entry(args, mode, bandwidth, rates, t_comp, t_comm):
    per_step = args.workers * args.batch_size
    return {"mode": mode, "model": args.model, "mlp_hidden": args.mlp_hidden,
            "workers": args.workers, "dense_layers": args.dense_layers,
            "dense_width": args.dense_width, "image_size": args.image_size,
            "servers": args.servers, "batch_size": args.batch_size,
            "topology": args.topology,
            "tcp_congestion": tcp_congestion(args.topology,
                                             getattr(args, "tcp_congestion", CONGESTION)),
            "bandwidth_mbit": bandwidth, "repeats": len(rates),
            "samples_per_sec": statistics.median(rates),
            "samples_per_sec_min": min(rates), "samples_per_sec_max": max(rates),
            "samples_per_sec_all": rates, "t_comp": t_comp, "t_comm": t_comm,
            "ssgd_bound_samples_per_sec": per_step / (t_comp + t_comm),
            "ideal_samples_per_sec": per_step / max(t_comp, t_comm)}


def _summarise(args, bandwidth, samples, compute, t_comm, overlaps, cores, resolutions=None,
               records=None):
    per_step = args.workers * args.batch_size
    shaped = shaped_mbit(args, bandwidth)
    sizes = compute.get("parameter_sizes")
    # the store's size settings the job ran with
    environ = dict(os.environ, **paced.scaled_store_environment(getattr(args, "byte_scale", 1)))
    link = link_fields(args.topology, args.workers, args.servers, compute["parameter_bytes"],
                       shaped)
    runs = []
    for mode, rates in samples.items():
        entry = _entry(args, mode, bandwidth, rates, compute["t_comp"], t_comm)
        entry.update(link)
        entry.update(cpu_summary(rates, cores[mode], args.cores, per_step,
                                 link["wire_seconds"], link["half_duplex_wire_seconds"]),
                     parameter_arrays=compute["parameter_arrays"])
        entry.update(_paced_fields(args, bandwidth))
        known = [r for r in (resolutions or {}).get(mode, []) if r is not None]
        entry["cores_resolution"] = statistics.median(known) if known else None
        entry.update(plan_fields(entry, per_step, shaped, sizes, environ))
        entry.update(record_fields((records or {}).get(mode)))
        if mode == "dist_odsgd":
            if sizes:
                entry["largest_key_share"] = mode_shares(sizes, args.servers,
                                                         environ)["dist_odsgd"]
            entry.update(prediction_fields(entry, per_step, shaped))
            entry.update(_overlap_fields(overlaps, t_comm))
        runs.append(entry)
    return runs


def record_fields(repeats):
    """What the link and the paced workers did, over the repeats of one mode (measure_mode's
    `records`): each field's median (tcp_per_step, server_nic, paced_phases) and every
    repeat's (`hosts_all`, the name results recorded since the link's counters came first);
    {} where none was recorded."""
    if not repeats:
        return {}
    fields = {"hosts_all": repeats}
    for name in ("tcp_per_step", "server_nic", "paced_phases"):
        known = [r[name] for r in repeats if name in r]
        if known:
            fields[name] = {key: (statistics.median(k[key] for k in known)
                                  if isinstance(known[0][key], (int, float)) else known[0][key])
                            for key in known[0]}
    return fields


def _overlap_fields(overlaps, t_comm):
    """dist_odsgd's overlap meter over the repeats: the mean wait and the share of t_comm
    hidden; {} without a measured wait."""
    waits = [o["mean_wait_s"] for o in overlaps or [] if o["mean_wait_s"] is not None]
    if not waits:
        return {}
    wait = statistics.mean(waits)
    return {"overlap_mean_wait_s": wait,
            "overlap_hidden_fraction": max(0.0, 1.0 - wait / t_comm) if t_comm else None}


def print_table(runs):
    by_bw = {}
    for r in runs:
        by_bw.setdefault(r["bandwidth_mbit"], {})[r["mode"]] = r
    print("\n%-12s %-11s %22s %7s %7s %7s %6s %9s %9s %9s %7s %6s %9s %6s"
          % ("bandwidth", "mode", "samples/s (min-max)", "x sync", "x async", "x ideal",
             "cores", "link bnd", "CPU bnd", "bound", "x bound", "hidden", "predicted",
             "x pred"))
    for bandwidth in sorted(by_bw, key=_bandwidth_order):
        modes = by_bw[bandwidth]
        sync = modes.get("dist_sync", {}).get("samples_per_sec")
        async_ = modes.get("dist_async", {}).get("samples_per_sec")
        for mode, r in modes.items():
            rate = r["samples_per_sec"]
            hidden = r.get("overlap_hidden_fraction")
            bound = r.get("bound_samples_per_sec")
            predicted = r.get("plan_samples_per_sec") or r.get("predicted_samples_per_sec")
            print("%-12s %-11s %8.1f (%6.1f-%6.1f) %7s %7s %7.2f %6s %9s %9s %9s %7s %6s %9s %6s"
                  % (_bw(bandwidth), mode, rate, r["samples_per_sec_min"],
                     r["samples_per_sec_max"],
                     "%.2f" % (rate / sync) if sync else "-",
                     "%.2f" % (rate / async_) if async_ else "-",
                     rate / r["ideal_samples_per_sec"],
                     "%.2f" % r["cores_in_use"] if r.get("cores_in_use") else "-",
                     _rate(r.get("link_bound_samples_per_sec")),
                     _rate(r.get("cpu_bound_samples_per_sec")), _rate(bound),
                     "%.2f" % (rate / bound) if bound else "-",
                     "%.0f%%" % (100 * hidden) if hidden is not None else "-",
                     _rate(predicted), "%.2f" % (rate / predicted) if predicted else "-"))
            if predicted:
                print("%-12s %-11s %8s   predicted: %s" % ("", "", "", _prediction_line(r)))
        any_run = next(iter(modes.values()))
        print("%-12s %-11s %8.1f   t_comp %.1f ms, t_comm %.1f ms; SSGD bound %.1f"
              % ("", "ideal", any_run["ideal_samples_per_sec"], 1e3 * any_run["t_comp"],
                 1e3 * any_run["t_comm"], any_run["ssgd_bound_samples_per_sec"]))
        print("%-12s %-11s %8s   %s" % ("", "link", _rate(any_run.get(
            "link_bound_samples_per_sec")), _link_line(any_run)))
        if any_run.get("byte_scale"):
            print("%-12s %-11s %8s   %s" % ("", "paced", "", _paced_line(any_run)))


def _prediction_line(r):
    """How a run's predicted rate came about, for the table: dist_odsgd's model on a shaped
    link with its terms (as before the other modes had one), else the mode's formula, step
    time and what binds."""
    # the model's t_link: the bound's at the share of the rate TCP's payload fills
    payload = topology_payload_share(r["topology"])
    t_link = (r.get("wire_seconds") or 0.0) / payload
    if r.get("predicted_samples_per_sec"):
        return ("T = %s = %.1f ms (t_comp %.1f ms, t_link %.1f ms, push %.1f ms, pull %.1f "
                "ms, s %.2f; payload %.3f of R; binds: %s)"
                % (r["predicted_formula"], 1e3 * r["predicted_step_seconds"],
                   1e3 * r["predicted_t_comp"], 1e3 * t_link,
                   1e3 * r["predicted_push_seconds"], 1e3 * r["predicted_pull_seconds"],
                   r.get("predicted_last_share", 1.0), payload, r.get("plan_binds", "-")))
    return ("T = %s = %.1f ms (t_comp %.1f ms, t_link %.1f ms, s %.2f; payload %.3f of R; "
            "binds: %s)"
            % (r["plan_formula"], 1e3 * r["plan_step_seconds"], 1e3 * r["t_comp"],
               1e3 * t_link, r.get("plan_share", 1.0), payload, r.get("plan_binds", "-")))


def _paced_line(r):
    """What an accelerator-paced run waited and exchanged, for the console."""
    device = ("%s, %s" % (r["device_profile"], r["device"]) if r.get("device_profile")
              else "--compute-ms")
    text = ("accelerator-paced: %.1f ms per step (%s); %s's shapes, %.1f MB at scale 1"
            % (r["compute_ms"], device, r["model_for_shapes"],
               r["unscaled_parameter_bytes"] / 1e6))
    if r["byte_scale"] != 1:
        text += ("; byte scale %d: arrays and link / %d (NICs shaped to %g Mbit/s)"
                 % (r["byte_scale"], r["byte_scale"], r["shaped_mbit"]))
    if r.get("local_update_gpu_seconds") is not None:
        text += ("; the local update on its GPU, not paced here: about %.2f ms"
                 % (1e3 * r["local_update_gpu_seconds"]))
    return text


def _rate(value):
    return "%.1f" % value if value else "-"


def _link_line(r):
    """How the link bound of a run came about, for the table."""
    if r.get("topology") is None:     # results of an older version
        return ""
    where = ("one direction of the busiest NIC" if r["topology"] == "hosts"
             else "the one shaped loopback queue")
    text = ("%s: N=%d S=%d M=%.2f MB; %.2f MB/step through %s"
            % (r["topology"], r["workers"], r["servers"], r["parameter_bytes"] / 1e6,
               r["wire_bytes_per_step"] / 1e6, where))
    if not r.get("wire_seconds"):
        return text + "; unshaped: no link bound"
    return text + ("; t_link = %s = %.1f ms at R = %.1f MB/s (half-duplex %.1f)"
                   % (r["link_formula"], 1e3 * r["wire_seconds"],
                      r["link_bytes_per_sec"] / 1e6,
                      r["half_duplex_link_bound_samples_per_sec"]))


def plot(runs, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 4.5))
    bandwidths = sorted({r["bandwidth_mbit"] for r in runs}, key=_bandwidth_order)
    labels = [str(b) if b else "unshaped" for b in bandwidths]
    xs = range(len(bandwidths))
    for mode in MODES:
        rows = {r["bandwidth_mbit"]: r for r in runs if r["mode"] == mode}
        if not rows:
            continue
        med = [rows[b]["samples_per_sec"] for b in bandwidths]
        low = [rows[b]["samples_per_sec"] - rows[b]["samples_per_sec_min"] for b in bandwidths]
        high = [rows[b]["samples_per_sec_max"] - rows[b]["samples_per_sec"] for b in bandwidths]
        ax.errorbar(xs, med, yerr=[low, high], marker="o", capsize=3, label=mode)
    first = {r["bandwidth_mbit"]: r for r in runs}
    ax.plot(xs, [first[b]["ideal_samples_per_sec"] for b in bandwidths], "k--",
            label="ideal overlap 1/max(t_comp, t_comm)")
    ax.plot(xs, [first[b]["ssgd_bound_samples_per_sec"] for b in bandwidths], "k:",
            label="SSGD 1/(t_comp + t_comm)")
    ax.set_xticks(list(xs))
    ax.set_xticklabels(labels)
    ax.set_xlabel("loopback bandwidth (Mbit/s)")
    ax.set_ylabel("samples/s (all workers)")
    r0 = runs[0]
    ax.set_title("%s, %d workers x batch %d, %d server(s)"
                 % (r0["model"], r0["workers"], r0["batch_size"], r0["servers"]))
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None):
    args = parse_args(argv)
    os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
    try:
        runs = run(args)
    except JobFailed as failure:
        print("odsgd.bench throughput: %s" % failure, file=sys.stderr)
        return 1
    print_table(runs)
    with open(args.json, "w") as f:
        command = "python -m odsgd.bench throughput " + " ".join(
            sys.argv[2:] if argv is None else list(argv))
        json.dump({"command": command, "runs": runs}, f, indent=1)
    plot_path = args.plot or os.path.splitext(args.json)[0] + ".png"
    plot(runs, plot_path)
    print("\nwrote %s and %s" % (args.json, plot_path))
    return 0
