"""`python -m odsgd.bench timeline`: a picture of a few training steps of every worker, for
dist_sync, dist_async and dist_odsgd side by side: when each worker computed, when each of
its pushes and pulls was in flight, when it ran its local update, on one time axis in ms.

It runs the throughput benchmark's job (odsgd.bench.throughput_job) once per mode, on the same
link as `odsgd.bench throughput` (unshaped or shaped loopback, or emulated hosts), with
ODSGD_TIMELINE set so that every worker records MXNet's profiler trace (odsgd/worker/trace.py),
then picks a window of --window steady-state steps of each mode and draws it (--out PNG), with
the window's events in --json. It prints, per mode, the mean step time and the share of the
window in which each lane was busy: a push or pull lane well below 100% is a direction of the
link that stood idle. docs/benchmarks.md, "Timeline", says how to read it.

On --topology hosts it also records the first server's NIC (odsgd.bench.nic_meter: its byte
counters every 3 ms, on the traces' clock): it prints per mode the share of the window in
which each direction of that NIC was busy (above half the link's rate) and both at once, and
draws its rate in and out in two rows under the workers' rows; and per mode what TCP and the
shaped queues did in the job (odsgd.bench.tcp_counters: retransmissions, retransmission
timeouts, drops, per step), which the byte counters do not show.

A `pushpull` event (one request that pushes a gradient and brings the new weights back:
Gluon's Trainer under dist_sync and dist_async, or a store's kv.pushpull) cannot be split
into its push and its pull: it counts in both lanes and is drawn as one bar across both.
"""
import argparse
import json
import os
import sys
import tempfile
import time

from ..worker import trace as tl
from ..cluster.emulate import EmulationError
from . import nic_meter, tcp_counters
from .jobs import TOPOLOGIES, TOPOLOGY_HELP, JobFailed, job_placement, run_job
from .throughput import MODES, _env, _job_args
from .throughput_job import MODEL_HELP, mlp_parameter_count

#: colours of the event kinds in the picture (a pushpull is hatched in both lanes)
COLOURS = {"compute": "#4c72b0", "copy": "#a0a0a0", "push": "#dd8452", "pull": "#55a868",
           "pushpull": "#8172b3", "local_update": "#c44e52"}
LEGEND = (("compute", "compute (forward, backward)"), ("copy", "copy / pack"),
          ("push", "push in flight"), ("pull", "pull in flight"),
          ("pushpull", "push+pull in one request (kv.pushpull; across both lanes)"),
          ("local_update", "local update (odsgd_*)"))


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="odsgd.bench timeline", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="mlp", help=MODEL_HELP)
    p.add_argument("--batch-size", type=int, default=128, help="per worker")
    p.add_argument("--image-size", type=int, default=224, help="for the ResNets")
    p.add_argument("--mlp-hidden", type=int, default=1024, help="hidden units of 'mlp'")
    p.add_argument("--dense-layers", type=int, default=81, help="layers of 'dense'")
    p.add_argument("--dense-width", type=int, default=16, help="units per layer of 'dense'")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--servers", type=int, default=1)
    p.add_argument("--bandwidth-mbit", type=int, default=0,
                   help="Mbit/s of the shaped link (0 = unshaped; shaping needs root)")
    p.add_argument("--topology", choices=TOPOLOGIES, default="loopback", help=TOPOLOGY_HELP)
    p.add_argument("--steps", type=int, default=24, help="steps recorded after --skip")
    p.add_argument("--skip", type=int, default=4, help="steps first (start-up, warm-up)")
    p.add_argument("--window", type=int, default=4, help="steady-state steps drawn")
    p.add_argument("--modes", default=",".join(MODES))
    p.add_argument("--warmup-steps", type=int, default=2,
                   help="dist_odsgd's SSGD warm-up (ODSGD_WARMUP_STEPS)")
    p.add_argument("--omp-threads", type=int, default=1, help="OMP_NUM_THREADS per process")
    p.add_argument("--timeout", type=int, default=600, help="seconds per job")
    p.add_argument("--stall-timeout", type=int, default=60,
                   help="end a job that prints nothing for this many seconds")
    p.add_argument("--out", default="runs/timeline.png", help="the picture (PNG)")
    p.add_argument("--json", default=None,
                   help="the window's events per mode and worker (default: --out's .json)")
    p.add_argument("--traces", default=None,
                   help="keep the workers' raw traces in this folder (default: a temporary "
                        "one, deleted); they open in chrome://tracing or ui.perfetto.dev")
    args = p.parse_args(argv)
    _check(p, args)
    args.json = args.json or os.path.splitext(args.out)[0] + ".json"
    # No overlap probes in dist_odsgd (throughput's ODSGD_METRICS_INTERVAL): their waits
    # would be drawn as part of the steps.
    args.overlap_interval = 0
    return args


def _check(parser, args):
    """Bad input gets a usage error naming the fix, before any job starts."""
    args.mode_list = [m.strip() for m in args.modes.split(",") if m.strip()]
    for mode in args.mode_list:
        if mode not in MODES:
            parser.error("unknown mode %r; choose from %s" % (mode, ", ".join(MODES)))
    if not args.mode_list:
        parser.error("--modes names no mode")
    for name in ("workers", "servers", "batch_size", "window"):
        if getattr(args, name) < 1:
            parser.error("--%s must be >= 1" % name.replace("_", "-"))
    if args.bandwidth_mbit < 0 or args.skip < 0 or args.steps < 1:
        parser.error("--bandwidth-mbit and --skip must be >= 0, --steps >= 1")
    needed = tl._steps_needed(args.window)
    if args.skip + args.steps < needed:
        parser.error("a window of %d steady steps needs --skip + --steps >= %d"
                     % (args.window, needed))
    if not args.out.lower().endswith(".png"):
        parser.error("--out must name a .png file, got %r" % args.out)


# -- running ------------------------------------------------------------------------------
def record_mode(args, mode, place, folder, nic=None):
    """Runs the job of `mode` with every worker recording; the traces' events, per rank.
    With `nic` (a list), the first server's NIC counters (nic_meter) are sampled during the
    job on emulated hosts and put into it."""
    out = os.path.join(folder, mode)
    os.makedirs(out, exist_ok=True)
    trace = os.path.join(out, "trace.json")
    env = dict(_env(args, mode), ODSGD_TIMELINE=trace)
    meter = nic_meter.server_nic_meter(place, "timeline") if nic is not None else None
    if meter is None:
        run_job(_job_args(args, out, kvstore=mode), args.workers, args.servers, args.timeout,
                env=env, stall_timeout=args.stall_timeout, **place)
    else:
        with meter:
            run_job(_job_args(args, out, kvstore=mode), args.workers, args.servers,
                    args.timeout, env=env, stall_timeout=args.stall_timeout, **place)
        nic.extend(meter.samples)
    traces = []
    for rank in range(args.workers):
        path = tl.trace_file(trace, rank)
        if not os.path.exists(path):
            raise JobFailed("worker %d of the %s job wrote no trace (%s)" % (rank, mode, path))
        traces.append(tl.read_trace(path))
    return traces


def summarise(args, traces, nic=None):
    """The window (rank 0's steady steps, the same span for every worker) and per worker its
    events there, its lanes' busy shares there and its mean step time over the steady run.
    With `nic`, the first server's NIC counters (time, rx, tx) during the job: their
    nic_summary over the window and their rates in it (`server_nic`)."""
    total = args.skip + args.steps
    marks = [tl.step_marks(events, steps=total) for events in traces]
    window = tl.steady_window(marks[0], args.window)
    ranks = []
    for rank, (events, own) in enumerate(zip(traces, marks)):
        ranks.append({"rank": rank, "mean_step_ms": 1e3 * tl.mean_step_seconds(own),
                      "busy": tl.lane_fractions(events, window.start_s, window.end_s),
                      "events": [_ms(e, window.start_s)
                                 for e in tl.in_window(events, window.start_s, window.end_s)
                                 if e.kind != "other"]})
    lanes = [label for label, _ in tl.LANES]
    result = {"window_start_s": window.start_s,
              "window_ms": 1e3 * (window.end_s - window.start_s),
              "marks_ms": [1e3 * (m - window.start_s) for m in window.marks],
              "mean_step_ms": sum(r["mean_step_ms"] for r in ranks) / len(ranks),
              "busy": {lane: sum(r["busy"][lane] for r in ranks) / len(ranks)
                       for lane in lanes},
              "ranks": ranks}
    if nic and len(nic) >= 2:
        result["server_nic"] = server_nic_fields(nic, args.bandwidth_mbit, window.start_s,
                                                 window.end_s)
    return result


def server_nic_fields(samples, link_mbit, start_s, end_s):
    """nic_summary over [start_s, end_s] and, for the picture, the rates of the intervals
    that overlap it: [start ms, end ms, in Mbit/s, out Mbit/s] from start_s, clipped."""
    fields = nic_meter.nic_summary(samples, link_mbit, start_s, end_s)
    fields["rates"] = [[round(1e3 * (max(t0, start_s) - start_s), 4),
                        round(1e3 * (min(t1, end_s) - start_s), 4),
                        round(8 * rate_in / 1e6, 3), round(8 * rate_out / 1e6, 3)]
                       for t0, t1, rate_in, rate_out in nic_meter.rates(sorted(samples))
                       if t1 > start_s and t0 < end_s]
    return fields


def _ms(event, origin):
    return {"name": event.name, "kind": event.kind,
            "start_ms": round(1e3 * (event.start_s - origin), 4),
            "end_ms": round(1e3 * (event.end_s - origin), 4)}


def run(args, folder):
    results = {}
    with job_placement(args.topology, args.bandwidth_mbit, args.workers, args.servers) as place:
        for mode in args.mode_list:
            print("[timeline] %-10s %d workers, %d server(s), %d steps, %s ..."
                  % (mode, args.workers, args.servers, args.skip + args.steps, link_text(args)),
                  flush=True)
            tic = time.time()
            nic = [] if args.topology == "hosts" else None
            cluster = place.get("hosts")
            with tcp_counters.counting(cluster, args.skip + args.steps) as tcp_per_step:
                traces = record_mode(args, mode, place, folder, nic)
            results[mode] = summarise(args, traces, nic)
            if cluster:
                results[mode]["tcp_per_step"] = tcp_per_step
            print("[timeline] %-10s done in %.0f s: %s events recorded, mean step %.1f ms"
                  % (mode, time.time() - tic, " + ".join(str(len(t)) for t in traces),
                     results[mode]["mean_step_ms"]), flush=True)
    return results


# -- output -------------------------------------------------------------------------------
def link_text(args):
    if args.topology == "hosts":
        return "emulated hosts, each NIC %s" % (
            "shaped to %d Mbit/s" % args.bandwidth_mbit if args.bandwidth_mbit else "unshaped")
    if args.bandwidth_mbit:
        return "loopback shaped to %d Mbit/s" % args.bandwidth_mbit
    return "unshaped loopback"


def model_text(args):
    if args.model == "mlp":
        return "mlp (hidden %d, %.2f M parameters)" % (
            args.mlp_hidden, mlp_parameter_count(args.mlp_hidden) / 1e6)
    if args.model == "dense":
        return "dense (%d x Dense(%d))" % (args.dense_layers, args.dense_width)
    return args.model


def print_table(args, results):
    lanes = [label for label, _ in tl.LANES]
    print("\nwindow: %d steady steps per mode; busy = share of the window (mean over workers)"
          % args.window)
    print("%-11s %9s" % ("mode", "step ms") + "".join(" %15s" % lane for lane in lanes))
    for mode, result in results.items():
        print("%-11s %9.1f" % (mode, result["mean_step_ms"]) +
              "".join(" %14.0f%%" % (100 * result["busy"][lane]) for lane in lanes))
    for mode, result in results.items():
        if "server_nic" in result:
            print("%-11s %s" % (mode, nic_meter.summary_line(result["server_nic"])))
    for mode, result in results.items():
        if "tcp_per_step" in result:
            print("%-11s TCP %s" % (mode, tcp_counters.summary_line(result["tcp_per_step"])))
    together = [mode for mode, result in results.items()
                if any(e["kind"] == "pushpull" for r in result["ranks"] for e in r["events"])]
    if together:
        print("(%s send each key's push and pull as one request (pushpull): both lanes are "
              "busy together)" % " and ".join(together))


def write_json(args, results, path, command):
    _parent(path)
    with open(path, "w") as f:
        json.dump({"command": command, "model": args.model, "model_text": model_text(args),
                   "batch_size": args.batch_size, "workers": args.workers,
                   "servers": args.servers, "bandwidth_mbit": args.bandwidth_mbit,
                   "topology": args.topology, "steps": args.skip + args.steps,
                   "window_steps": args.window, "lanes": [l for l, _ in tl.LANES],
                   "modes": results}, f, indent=1)


def plot(args, results, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch
    rows = args.workers * len(tl.LANES) + (2 if any("server_nic" in r
                                                 for r in results.values()) else 0)
    fig, axes = plt.subplots(len(results), 1, sharex=True, squeeze=False,
                             figsize=(12, 1.3 + len(results) * (0.75 + 0.28 * rows)))
    for ax, (mode, result) in zip(axes[:, 0], results.items()):
        _panel(ax, mode, result, args.bandwidth_mbit)
    longest = max(r["window_ms"] for r in results.values())
    axes[-1, 0].set_xlim(0, longest)
    axes[-1, 0].set_xlabel("ms from the window's start; dotted: the same point of every "
                           "step (the end of its _backward* operators)")
    handles = [Patch(facecolor=COLOURS[k], hatch="//" if k == "pushpull" else None, label=text)
               for k, text in LEGEND]
    fig.legend(handles=handles, loc="upper center", ncol=3, fontsize=8,
               bbox_to_anchor=(0.5, 0.995 - 0.35 / fig.get_figheight()))
    fig.suptitle("%s, %d workers x batch %d, %d server(s); %s; %d steady steps per mode"
                 % (model_text(args), args.workers, args.batch_size, args.servers,
                    link_text(args), args.window), fontsize=10, y=0.995)
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.8 / fig.get_figheight()))
    _parent(path)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _panel(ax, mode, result, link_mbit=0):
    """One mode: a row per worker and lane, top to bottom; each lane's events as bars. A kind
    drawn in several adjacent lanes (pushpull: push and pull) is one bar across them. Then,
    where recorded, two rows of the first server's NIC rate, in and out."""
    labels = []
    for rank in result["ranks"]:
        rows = {}
        for label, kinds in tl.LANES:
            for kind in kinds:
                rows.setdefault(kind, []).append(-len(labels))
            labels.append("w%d %s" % (rank["rank"], label))
        for kind, ys in rows.items():
            spans = [(e["start_ms"], e["end_ms"] - e["start_ms"]) for e in rank["events"]
                     if e["kind"] == kind]
            if not spans:
                continue
            if max(ys) - min(ys) == len(ys) - 1:          # adjacent lanes: one bar
                bands = [(min(ys) - 0.38, max(ys) - min(ys) + 0.76)]
            else:
                bands = [(y - 0.38, 0.76) for y in ys]
            for band in bands:
                ax.broken_barh(spans, band, facecolor=COLOURS[kind], edgecolor="black",
                               linewidth=0.2, alpha=0.85,
                               hatch="//" if kind == "pushpull" else None)
    nic = result.get("server_nic")
    if nic:
        labels += _nic_rows(ax, nic, -len(labels), link_mbit)
    for mark in result["marks_ms"]:
        ax.axvline(mark, color="grey", linestyle=":", linewidth=0.8)
    ax.set_yticks([-i for i in range(len(labels))])
    ax.set_yticklabels(labels, fontsize=7)
    ax.set_ylim(-len(labels) + 0.4, 0.6)
    busy = result["busy"]
    ax.set_title("%s: step %.1f ms; busy: compute %.0f%%, push %.0f%%, pull %.0f%%, "
                 "local update %.0f%%"
                 % (mode, result["mean_step_ms"], 100 * busy["compute"],
                    100 * busy["push in flight"], 100 * busy["pull in flight"],
                    100 * busy["local update"]), fontsize=9, loc="left")
    if nic and nic.get("in_busy") is not None:
        ax.set_title(ax.get_title(loc="left") +
                     "; server NIC busy: in %.0f%%, out %.0f%%, both %.0f%%"
                     % (100 * nic["in_busy"], 100 * nic["out_busy"], 100 * nic["both_busy"]),
                     fontsize=9, loc="left")
    ax.grid(axis="x", alpha=0.3)


def _nic_rows(ax, nic, top, link_mbit):
    """Draws the server NIC's rate in (row `top`) and out (row `top` - 1), each scaled so
    that a full row is the link's rate (the highest rate seen, unshaped), with a dotted line
    at the busy threshold; returns the rows' labels."""
    rates = nic["rates"]
    scale = link_mbit or max([max(r[2], r[3]) for r in rates] + [1e-9])
    labels = []
    for offset, (label, column, colour) in enumerate((("in", 2, COLOURS["push"]),
                                                      ("out", 3, COLOURS["pull"]))):
        y = top - offset
        labels.append("server NIC %s" % label)
        if rates:
            xs = [r[0] for r in rates] + [rates[-1][1]]
            heights = [min(r[column] / scale, 1.0) for r in rates]
            ax.fill_between(xs, y - 0.38, [y - 0.38 + 0.76 * h for h in heights] +
                            [y - 0.38 + 0.76 * heights[-1]], step="post", color=colour,
                            alpha=0.8, linewidth=0)
        ax.axhline(y - 0.38 + 0.76, color="grey", linewidth=0.4)
        if link_mbit:
            ax.axhline(y - 0.38 + 0.76 * nic_meter.BUSY_SHARE, color="black",
                       linestyle=":", linewidth=0.6)
    return labels


def _parent(path):
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)


def main(argv=None):
    args = parse_args(argv)
    try:
        if args.traces:
            os.makedirs(args.traces, exist_ok=True)
            results = run(args, os.path.abspath(args.traces))
        else:
            with tempfile.TemporaryDirectory(prefix="odsgd-timeline-") as folder:
                results = run(args, folder)
    except (JobFailed, EmulationError, PermissionError, ValueError) as failure:
        print("odsgd.bench timeline: %s" % failure, file=sys.stderr)
        return 1
    print_table(args, results)
    command = "python -m odsgd.bench timeline " + " ".join(
        sys.argv[2:] if argv is None else list(argv))
    write_json(args, results, args.json, command)
    plot(args, results, args.out)
    print("\nwrote %s and %s" % (args.out, args.json))
    return 0
