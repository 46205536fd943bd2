"""`python -m odsgd.bench time-to-accuracy`: test accuracy against training wall time of
dist_sync, dist_async and dist_odsgd on real images (odsgd.bench.image_job: LeNet on
Fashion-MNIST or MNIST-5k), each (bandwidth, mode, seed) a job of 2 workers + 1 server
through odsgd.launch, one job at a time, either inside a network namespace whose loopback is
shaped to the bandwidth (--topology loopback; 0: unshaped, no namespace) or on emulated hosts,
one per server and per worker, each NIC shaped to the bandwidth (--topology hosts).

    python -m odsgd.bench time-to-accuracy --bandwidth-mbit auto,0 --seeds 0,1,2 \\
        --out runs/time_to_accuracy

`auto` is the bandwidth at which one step's traffic takes as long on the wire as one step's
computation (t_comm = t_comp): t_comp is measured first (one process, no kvstore), and a step
moves every parameter once up and once down per worker (on loopback all of it through the one
shaped bucket; on hosts the server's NIC carries every worker's push in and pull out at once).
The seeds run in turn, each seed's modes in a rotated order, so that a slow spell of the
machine does not fall on one mode's runs only.
Modes as in `odsgd.bench convergence` (`dist_odsgd` = the store's defaults; `odsgd:NAME=VALUE,
...` for other settings).

`--reuse JSON` takes the runs of a saved study (the same data, model, schedule, optimizer and
cluster: checked) instead of running them again, by mode, seed and bandwidth: e.g. dist_sync's
runs, whose accuracies do not depend on timing, for a study of other dist_odsgd settings. Each
run is added to `--out`/runs_so_far.json as it ends, so that a study that was stopped goes on
with `--reuse` of that file.

Per bandwidth, the target is dist_sync's final mean accuracy; each mode's time to target is
the training time (evaluations taken out) of its first evaluation at or above it, per seed,
and of the mean curve over seeds. Writes OUT/time_to_accuracy.json and OUT/time_to_accuracy.png
(accuracy against time, mean over seeds, min-max band), prints a Markdown table.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from statistics import mean

from odsgd.bench import convergence
from odsgd.bench.jobs import (REPO, parse_optimizer_params, TOPOLOGIES, TOPOLOGY_HELP, JobFailed,
                              job_environment, job_placement, run_job, step_wire_bits)
from odsgd.training import schedule

DEFAULT_MODES = "dist_sync,dist_async,dist_odsgd"
PARAMETERS = 431080          # odsgd.bench.image_job.make_net()
BYTES_PER_VALUE = 4
# A run that ends below this accuracy has diverged: chance is 10% on the 10 classes of both
# data sets, and a trained LeNet is far above it.
DIVERGED_BELOW = 0.15


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="python -m odsgd.bench time-to-accuracy",
                                description=__doc__.splitlines()[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="\n".join(__doc__.splitlines()[2:]))
    p.add_argument("--dataset", choices=("fashion-mnist", "mnist-5k"), default=None,
                   help="default: fashion-mnist when installed, else mnist-5k")
    p.add_argument("--data-dir", help="original idx files instead of the packaged data")
    p.add_argument("--modes", default=DEFAULT_MODES)
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--bandwidth-mbit", default="auto,0",
                   help="comma separated Mbit/s; 0 = unshaped; auto = t_comm equal to t_comp")
    p.add_argument("--topology", choices=TOPOLOGIES, default="loopback", help=TOPOLOGY_HELP)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--train-subset", type=int, default=0, help="first N training images")
    p.add_argument("--test-subset", type=int, default=0, help="first N test images")
    p.add_argument("--batch-size", type=int, default=128, help="per worker")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--optimizer", default="sgd",
                   help="the global optimizer of every mode, any mx.optimizer name (sgd, nag, "
                   "adam, rmsprop, ...)")
    p.add_argument("--momentum", type=float, default=0.9,
                   help="of the optimizers that take one (sgd, nag, signum, lars, lbsgd)")
    p.add_argument("--optimizer-params", default="",
                   help="the global optimizer's own arguments, NAME=VALUE,... (e.g. "
                   "beta1=0.9,beta2=0.999)")
    p.add_argument("--lr-mode", choices=schedule.MODES, default="cosine",
                   help="the global rate's schedule over the run")
    p.add_argument("--lr-decay-epoch", default="",
                   help="step mode: comma-separated epochs at which the rate falls tenfold")
    p.add_argument("--eval-interval", type=int, default=0,
                   help="global steps between evaluations (0: every epoch)")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--servers", type=int, default=1)
    p.add_argument("--timeout", type=float, default=900, help="seconds per job")
    p.add_argument("--out", default="runs/time_to_accuracy")
    p.add_argument("--replot", metavar="JSON", help="no jobs: the table, summary and PNG of "
                   "a study's saved time_to_accuracy.json again (beside it)")
    p.add_argument("--reuse", metavar="JSON", action="append", default=[],
                   help="a saved time_to_accuracy.json of the same settings: its runs of a "
                   "planned (mode, seed, bandwidth) are taken as they are, not run again "
                   "(their samples/s are that study's); may be given several times")
    args = p.parse_args(argv)
    args.modes = convergence.split_modes(args.modes)
    try:
        for mode in args.modes:
            job_mode(mode)
    except ValueError as error:
        p.error(str(error))
    if "dist_sync" not in args.modes:
        p.error("--modes must include dist_sync: its final accuracy is the target")
    args.seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    args.bandwidths = [b.strip() for b in args.bandwidth_mbit.split(",") if b.strip()]
    for b in args.bandwidths:
        if b != "auto" and not (b.isdigit()):
            p.error("--bandwidth-mbit: %r is neither a number >= 0 nor auto" % b)
    if any(b not in ("auto", "0") for b in args.bandwidths) and os.geteuid() != 0:
        p.error("shaped bandwidths need root (network namespaces); use --bandwidth-mbit 0")
    if args.topology == "hosts" and os.geteuid() != 0:
        p.error("--topology hosts needs root (network namespaces and sshd); use --topology "
                "loopback")
    if args.lr_decay_epoch and args.lr_mode != "step":
        p.error("--lr-decay-epoch needs --lr-mode step")
    try:
        parse_optimizer_params(args.optimizer_params)
    except ValueError as error:
        p.error(str(error))
    if args.dataset is None:
        from odsgd.training import image_datasets
        args.dataset = image_datasets.default_dataset()
    return args


def job_mode(mode):
    """(kvstore, ODSGD_* environment): `dist_odsgd` is the store's defaults."""
    return convergence.parse_mode("odsgd" if mode == "dist_odsgd" else mode)


def job_arguments(args, kvstore, seed):
    extra = ["--data-dir", args.data_dir] if args.data_dir else []
    return ["odsgd.bench.image_job", "--kvstore", kvstore, "--seed", seed,
            "--dataset", args.dataset, "--num-epochs", args.epochs,
            "--train-subset", args.train_subset, "--test-subset", args.test_subset,
            "--batch-size", args.batch_size, "--lr", args.lr, "--optimizer", args.optimizer,
            "--momentum", args.momentum, "--optimizer-params", args.optimizer_params,
            "--lr-mode", args.lr_mode, "--eval-interval", args.eval_interval] + extra + (
                ["--lr-decay-epoch", args.lr_decay_epoch] if args.lr_decay_epoch else [])


def run_image_job(module_args, workers, servers, timeout, env=None, netns=None, show=None,
                  hosts=None):
    """Runs one odsgd.bench.image_job (on loopback, in `netns` if given, or across the
    emulated `hosts`); returns rank 0's JSON."""
    env = dict(env or {}, OMP_NUM_THREADS="1")
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "result.json")
        run_job(list(module_args) + ["--json", path], workers=workers, servers=servers,
                timeout=timeout, env=env, netns=netns, show=show, stall_timeout=300,
                hosts=hosts)
        with open(path) as f:
            return json.load(f)


def measure_compute_seconds(args):
    """t_comp: seconds of one step's forward, backward and update in one process with no
    kvstore (a local image job of a few steps, started without the launcher)."""
    steps = 16
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "result.json")
        command = [sys.executable, "-m", "odsgd.bench.image_job", "--kvstore", "local",
                   "--dataset", args.dataset, "--train-subset", str(steps * args.batch_size),
                   "--test-subset", "100", "--num-epochs", "1", "--batch-size",
                   str(args.batch_size), "--json", path]
        subprocess.run(command, check=True, timeout=300, capture_output=True, cwd=REPO,
                       env=job_environment({"OMP_NUM_THREADS": "1"}))
        with open(path) as f:
            result = json.load(f)
    return result["train_seconds"] / result["steps"]


def balanced_bandwidth(t_comp, workers, servers=1, topology="loopback"):
    """Mbit/s at which one step's traffic through the busiest shaped queue (jobs.step_wire_bits)
    takes t_comp on the wire."""
    bits = step_wire_bits(topology, workers, servers, PARAMETERS * BYTES_PER_VALUE)
    return max(1, int(round(bits / t_comp / 1e6)))


def interleaved_plan(modes, seeds):
    """(mode, seed) pairs: seed by seed, each seed's modes rotated by one more place, so
    that no mode always runs first or last."""
    plan = []
    for i, seed in enumerate(seeds):
        shift = i % len(modes)
        plan.extend((mode, seed) for mode in modes[shift:] + modes[:shift])
    return plan


def seconds_to_target(history, target):
    """Training seconds of the first evaluation at or above `target`, else None."""
    for point in history:
        if point["test_accuracy"] >= target - 1e-12:
            return point["train_seconds"]
    return None


def mean_curve(records):
    """(train seconds, accuracy) per evaluation, each the mean over `records` (their common
    number of evaluations)."""
    count = min(len(r["history"]) for r in records)
    return [{"train_seconds": mean([r["history"][i]["train_seconds"] for r in records]),
             "test_accuracy": mean([r["history"][i]["test_accuracy"] for r in records])}
            for i in range(count)]


def summarize(runs):
    """{bandwidth: {'target', 'modes': {mode: {...}}}} (see the module docstring)."""
    summary = {}
    for bandwidth in sorted({r["bandwidth_mbit"] for r in runs}, key=lambda b: b or 1e12):
        mine = [r for r in runs if r["bandwidth_mbit"] == bandwidth and "error" not in r]
        sync = [r["final_test_accuracy"] for r in mine if r["mode"] == "dist_sync"]
        target = mean(sync) if sync else None
        modes = {}
        for mode in dict.fromkeys(r["mode"] for r in runs if r["bandwidth_mbit"] == bandwidth):
            records = [r for r in mine if r["mode"] == mode]
            failed = sum(1 for r in runs if r["bandwidth_mbit"] == bandwidth
                         and r["mode"] == mode and "error" in r)
            entry = {"failed": failed, "n": len(records)}
            if records:
                finals = [r["final_test_accuracy"] for r in records]
                per_seed = [seconds_to_target(r["history"], target) for r in records] \
                    if target is not None else []
                reached = [s for s in per_seed if s is not None]
                entry.update(
                    final_mean=mean(finals), final_min=min(finals), final_max=max(finals),
                    finals=finals, samples_per_sec=mean([r["samples_per_sec"] for r in records]),
                    seconds_to_target_per_seed=per_seed,
                    seconds_to_target_mean_of_reached=mean(reached) if reached else None,
                    reached=len(reached),
                    diverged=sum(1 for f in finals if f < DIVERGED_BELOW),
                    seconds_to_target_of_mean_curve=seconds_to_target(mean_curve(records), target)
                    if target is not None else None)
            modes[mode] = entry
        sync_time = modes.get("dist_sync", {}).get("seconds_to_target_of_mean_curve")
        for entry in modes.values():
            mine_time = entry.get("seconds_to_target_of_mean_curve")
            entry["time_vs_dist_sync"] = (mine_time / sync_time) if mine_time and sync_time \
                else None
        summary[str(bandwidth)] = {"target": target, "modes": modes}
    return summary


def markdown_table(summary):
    lines = ["| bandwidth | mode | final % mean (min–max) | samples/s | s to target (mean curve) "
             "| × dist_sync's time | seeds reaching target | diverged |",
             "|---|---|---|---|---|---|---|---|"]
    for bandwidth, block in summary.items():
        label = "%s Mbit/s" % bandwidth if bandwidth != "0" else "unshaped"
        for mode, e in block["modes"].items():
            if "final_mean" not in e:
                lines.append("| %s | %s (%d failed) | | | | | | |" % (label, mode, e["failed"]))
                continue
            s = e["seconds_to_target_of_mean_curve"]
            lines.append("| %s | %s%s | %.2f (%.2f–%.2f) | %.0f | %s | %s | %d/%d | %d |" % (
                label, mode, " (%d failed)" % e["failed"] if e["failed"] else "",
                100 * e["final_mean"], 100 * e["final_min"], 100 * e["final_max"],
                e["samples_per_sec"], "%.1f" % s if s is not None else "never",
                "%.2f" % e["time_vs_dist_sync"] if e["time_vs_dist_sync"] else "",
                e["reached"], e["n"], e["diverged"]))
            label = ""
        if block["target"] is not None:
            lines.append("| | target: dist_sync's final mean %.2f%% | | | | | | |"
                         % (100 * block["target"]))
    return "\n".join(lines)


def plot(runs, summary, path, title):
    """Test accuracy against training time, one column per bandwidth, one line per mode (mean
    over seeds, band from min to max), the target as a dotted line: the whole run above, and
    below a close-up of the last points around the target, where each mode's time to target
    (of its mean curve) is marked."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    blocks = [(b, s) for b, s in summary.items()
              if any("final_mean" in e for e in s["modes"].values())]
    if not blocks:
        return None
    fig, axes = plt.subplots(2, len(blocks), figsize=(6.5 * len(blocks), 8.4), squeeze=False,
                             gridspec_kw={"height_ratios": [1, 1]})
    for column, (bandwidth, block) in enumerate(blocks):
        whole, close = axes[0][column], axes[1][column]
        for i, mode in enumerate(block["modes"]):
            records = [r for r in runs if str(r["bandwidth_mbit"]) == bandwidth
                       and r["mode"] == mode and "error" not in r]
            if not records:
                continue
            count = min(len(r["history"]) for r in records)
            acc = [[100 * r["history"][k]["test_accuracy"] for r in records]
                   for k in range(count)]
            t = [p["train_seconds"] for p in mean_curve(records)]
            colour = plt.get_cmap("tab10")(i % 10)
            diverged = block["modes"][mode].get("diverged", 0)
            label = mode + (" (%d of %d runs diverged)" % (diverged, len(records))
                            if diverged else "")
            for ax in (whole, close):
                ax.plot(t, [mean(a) for a in acc], marker=".", color=colour, label=label)
                ax.fill_between(t, [min(a) for a in acc], [max(a) for a in acc],
                                color=colour, alpha=0.15)
            reached = block["modes"][mode].get("seconds_to_target_of_mean_curve")
            if reached is not None:
                close.axvline(reached, color=colour, linestyle="--", linewidth=1)
        link = "%s Mbit/s" % bandwidth if bandwidth != "0" else "unshaped"
        finals = [100 * e["final_min"] for e in block["modes"].values() if "final_min" in e]
        whole.set_ylim(max(0, min(finals) - 15), 100)
        whole.set_title("%s, %s" % (title, link))
        if block["target"] is not None:
            target = 100 * block["target"]
            for ax in (whole, close):
                ax.axhline(target, color="grey", linestyle=":", label="dist_sync's final mean")
            tops = [100 * e["final_max"] for e in block["modes"].values() if "final_max" in e]
            close.set_ylim(target - 3, max(tops + [target]) + 0.5)
        close.set_title("close-up; dashed: time to dist_sync's final mean (mean curves)",
                        fontsize=9)
        for ax in (whole, close):
            ax.set(xlabel="training seconds (evaluations taken out)", ylabel="test accuracy %")
            ax.grid(alpha=0.3)
        whole.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return path


#: report entries that make two studies' runs comparable (--reuse checks them)
SAME_SETTINGS = ("dataset", "epochs", "batch_size", "lr", "optimizer", "momentum",
                 "optimizer_params", "lr_mode",
                 "lr_decay_epoch", "topology", "train_subset", "test_subset", "workers",
                 "servers", "eval_interval")


def settings_of(args):
    return {name: getattr(args, name) for name in SAME_SETTINGS}


def reusable_runs(paths, args):
    """{(mode, seed, bandwidth): run} of the saved studies at `paths`; ValueError where a
    study's settings differ from `args` (entries missing from an older study are not
    compared)."""
    mine, found = settings_of(args), {}
    for path in paths:
        with open(path) as f:
            report = json.load(f)
        differ = ["%s %r (here %r)" % (name, report[name], mine[name]) for name in SAME_SETTINGS
                  if name in report and report[name] != mine[name]]
        if differ:
            raise ValueError("--reuse %s: another study's settings: %s" % (path, ", ".join(differ)))
        for run in report["runs"]:
            if "error" not in run:
                found[(run["mode"], run["seed"], run["bandwidth_mbit"])] = dict(
                    run, reused_from=os.path.relpath(path, REPO))
    return found


def run_all(args):
    reusable = reusable_runs(args.reuse, args)
    runs, compute = [], None
    bandwidths = []
    for b in args.bandwidths:
        if b == "auto":
            compute = measure_compute_seconds(args)
            b = balanced_bandwidth(compute, args.workers, args.servers, args.topology)
            print("t_comp = %.1f ms per step (batch %d, one process): t_comm = t_comp at "
                  "%d Mbit/s on %s" % (1e3 * compute, args.batch_size, b, args.topology),
                  flush=True)
        bandwidths.append(int(b))
    plan = interleaved_plan(args.modes, args.seeds)
    number, total = 0, len(plan) * len(bandwidths)
    for bandwidth in bandwidths:
        # One link (a shaped namespace, or a set of emulated hosts) for all of a bandwidth's
        # jobs, one job at a time.
        with job_placement(args.topology, bandwidth, args.workers, args.servers) as place:
            for mode, seed in plan:
                number += 1
                record = reusable.get((mode, seed, bandwidth))
                if record is None:
                    record = run_one(args, bandwidth, mode, seed, place)
                    save_runs_so_far(args, runs + [record])
                runs.append(record)
                line = ("FAILED: %s" % record["error"].splitlines()[0]) if "error" in record \
                    else "%.2f%% after %.1f s training, %.0f samples/s%s" % (
                        100 * record["final_test_accuracy"], record["train_seconds"],
                        record["samples_per_sec"], " (from %s)" % record["reused_from"]
                        if "reused_from" in record else "")
                print("[%d/%d] %s %-12s seed %d: %s" % (
                    number, total, "%5d Mbit/s" % bandwidth if bandwidth else "  unshaped ",
                    mode, seed, line), flush=True)
    return runs, compute, bandwidths


def save_runs_so_far(args, runs):
    """The runs made so far, as a study that `--reuse` takes (RUNS_SO_FAR in --out): a study
    that is stopped goes on from there."""
    path = os.path.join(args.out, RUNS_SO_FAR)
    with open(path + ".tmp", "w") as f:
        json.dump(dict(settings_of(args), runs=runs), f, indent=1)
    os.replace(path + ".tmp", path)


#: the runs of a study made so far (save_runs_so_far)
RUNS_SO_FAR = "runs_so_far.json"


def run_one(args, bandwidth, mode, seed, place):
    """One job's record: its curve and speed, or 'error'."""
    kvstore, env = job_mode(mode)
    record = {"bandwidth_mbit": bandwidth, "topology": args.topology, "mode": mode,
              "seed": seed}
    tic = time.time()
    try:
        result = run_image_job(job_arguments(args, kvstore, seed), args.workers, args.servers,
                               args.timeout, env=env, **place)
    except JobFailed as failure:
        record["error"] = str(failure)[-2000:]
        return record
    record.update({k: result[k] for k in (
        "final_test_accuracy", "history", "samples_per_sec", "train_seconds", "steps",
        "train_images", "test_images", "store")})
    record["job_seconds"] = time.time() - tic
    return record


def write_outputs(report, folder):
    """Summarises report['runs'] into report['summary'], writes the JSON and the PNG into
    `folder` and prints the table; returns the two paths."""
    report["summary"] = summarize(report["runs"])
    json_path = os.path.join(folder, "time_to_accuracy.json")
    with open(json_path, "w") as f:
        json.dump(report, f, indent=1)
    png = plot(report["runs"], report["summary"], os.path.join(folder, "time_to_accuracy.png"),
               "LeNet on %s%s%s" % (report["dataset"], ", global NAG"
                                    if report.get("optimizer") == "nag" else "",
                                    ", emulated hosts"
                                    if report.get("topology") == "hosts" else ""))
    print(markdown_table(report["summary"]))
    return json_path, png


def replot(json_path):
    """--replot: the table, summary and PNG of a saved study again, without running jobs."""
    with open(json_path) as f:
        report = json.load(f)
    json_path, png = write_outputs(report, os.path.dirname(os.path.abspath(json_path)))
    print("\nwrote %s%s" % (json_path, " and %s" % png if png else ""))
    return 0


def main(argv=None):
    args = parse_args(argv)
    if args.replot:
        return replot(args.replot)
    os.makedirs(args.out, exist_ok=True)
    tic = time.time()
    print("time to accuracy: %s, modes %s, seeds %s, %d epochs, %s schedule%s, bandwidths %s "
          "on %s" % (args.dataset, "; ".join(args.modes), ",".join(map(str, args.seeds)),
                     args.epochs, args.lr_mode, " (decay at epochs %s)" % args.lr_decay_epoch
                     if args.lr_decay_epoch else "", ",".join(args.bandwidths), args.topology),
          flush=True)
    runs, compute, bandwidths = run_all(args)
    report = {"command": "python -m odsgd.bench time-to-accuracy " + " ".join(
                  sys.argv[1:] if argv is None else argv),
              "dataset": args.dataset, "model": "lenet", "modes": args.modes,
              "seeds": args.seeds, "epochs": args.epochs, "batch_size": args.batch_size,
              "lr": args.lr, "optimizer": args.optimizer, "momentum": args.momentum,
              "optimizer_params": args.optimizer_params, "lr_mode": args.lr_mode,
              "lr_decay_epoch": args.lr_decay_epoch, "topology": args.topology,
              "eval_interval": args.eval_interval, "reused": args.reuse,
              "train_subset": args.train_subset,
              "test_subset": args.test_subset, "workers": args.workers,
              "servers": args.servers, "t_comp": compute, "bandwidths_mbit": bandwidths,
              "total_seconds": time.time() - tic, "runs": runs}
    json_path, png = write_outputs(report, args.out)
    print("\nwrote %s%s (%.0f s)" % (json_path, " and %s" % png if png else "",
                                     time.time() - tic))
    return 1 if any("error" in r for r in runs) else 0
