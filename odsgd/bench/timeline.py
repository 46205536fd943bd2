"""`python -m odsgd.bench timeline`: a picture of a few training steps of every worker, for
dist_sync, dist_async and dist_odsgd side by side: when each worker computed, when each of
its pushes and pulls was in flight, when it ran its local update, on one time axis in ms.

It runs the throughput benchmark's job (odsgd.bench.throughput_job) once per mode, on the same
link as `odsgd.bench throughput` (unshaped or shaped loopback, or emulated hosts), with
ODSGD_TIMELINE set so that every worker records MXNet's profiler trace (odsgd/timeline.py),
then picks a window of --window steady-state steps of each mode and draws it (--out PNG), with
the window's events in --json. It prints, per mode, the mean step time and the share of the
window in which each lane was busy: a push or pull lane well below 100% is a direction of the
link that stood idle. docs/benchmarks.md, "Timeline", says how to read it.
"""
import argparse
import json
import os
import sys
import tempfile
import time

from .. import timeline as tl
from ..emulate import EmulationError
from .jobs import TOPOLOGIES, TOPOLOGY_HELP, JobFailed, job_placement, run_job
from .throughput import MODES, _env, _job_args
from .throughput_job import MODEL_HELP, mlp_parameter_count

#: colours of the event kinds in the picture (a pushpull is hatched in both lanes)
COLOURS = {"compute": "#4c72b0", "copy": "#a0a0a0", "push": "#dd8452", "pull": "#55a868",
           "pushpull": "#8172b3", "local_update": "#c44e52"}
LEGEND = (("compute", "compute (forward, backward)"), ("copy", "copy / pack"),
          ("push", "push in flight"), ("pull", "pull in flight"),
          ("pushpull", "push+pull in one request (Trainer under dist_sync/dist_async)"),
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
    p.add_argument("--out", default="results/timeline.png", help="the picture (PNG)")
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
def record_mode(args, mode, place, folder):
    """Runs the job of `mode` with every worker recording; the traces' events, per rank."""
    out = os.path.join(folder, mode)
    os.makedirs(out, exist_ok=True)
    trace = os.path.join(out, "trace.json")
    env = dict(_env(args, mode), ODSGD_TIMELINE=trace)
    run_job(_job_args(args, out, kvstore=mode), args.workers, args.servers, args.timeout,
            env=env, stall_timeout=args.stall_timeout, **place)
    traces = []
    for rank in range(args.workers):
        path = tl.trace_file(trace, rank)
        if not os.path.exists(path):
            raise JobFailed("worker %d of the %s job wrote no trace (%s)" % (rank, mode, path))
        traces.append(tl.read_trace(path))
    return traces


def summarise(args, traces):
    """The window (rank 0's steady steps, the same span for every worker) and per worker its
    events there, its lanes' busy shares there and its mean step time over the steady run."""
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
    return {"window_start_s": window.start_s,
            "window_ms": 1e3 * (window.end_s - window.start_s),
            "marks_ms": [1e3 * (m - window.start_s) for m in window.marks],
            "mean_step_ms": sum(r["mean_step_ms"] for r in ranks) / len(ranks),
            "busy": {lane: sum(r["busy"][lane] for r in ranks) / len(ranks) for lane in lanes},
            "ranks": ranks}


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
            traces = record_mode(args, mode, place, folder)
            results[mode] = summarise(args, traces)
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
    if any(m in results for m in ("dist_sync", "dist_async")):
        print("(dist_sync and dist_async send each key's push and pull as one request: both "
              "lanes are busy together)")


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
    rows = args.workers * len(tl.LANES)
    fig, axes = plt.subplots(len(results), 1, sharex=True, squeeze=False,
                             figsize=(12, 1.3 + len(results) * (0.75 + 0.28 * rows)))
    for ax, (mode, result) in zip(axes[:, 0], results.items()):
        _panel(ax, mode, result)
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


def _panel(ax, mode, result):
    """One mode: a row per worker and lane, top to bottom; each lane's events as bars."""
    labels = []
    for rank in result["ranks"]:
        for label, kinds in tl.LANES:
            y = -len(labels)
            labels.append("w%d %s" % (rank["rank"], label))
            for kind in kinds:
                spans = [(e["start_ms"], e["end_ms"] - e["start_ms"]) for e in rank["events"]
                         if e["kind"] == kind]
                if spans:
                    ax.broken_barh(spans, (y - 0.38, 0.76), facecolor=COLOURS[kind],
                                   edgecolor="black", linewidth=0.2, alpha=0.85,
                                   hatch="//" if kind == "pushpull" else None)
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
    ax.grid(axis="x", alpha=0.3)


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
