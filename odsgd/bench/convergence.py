"""`python -m odsgd.bench convergence`: test accuracy of dist_sync, dist_async and dist_odsgd
(in several configurations) on the same model, data and seeds, with local clusters started
through odsgd.launch, one job at a time.

    python -m odsgd.bench convergence --settings mlp,cnn --seeds 0,1,2 --epochs 15 \\
        --out runs/convergence

Settings are odsgd.bench.digits_job models on scikit-learn's bundled digits (real data,
offline). A mode is `dist_sync`, `dist_async`, `odsgd` (the store's defaults) or
`odsgd:NAME=VALUE,...` with settings of the store (local_optimizer, local_lr, local_momentum,
local_wd, compensation, compensation_mode, warmup_steps), passed to the job as ODSGD_*
variables; every ODSGD_* variable not named is cleared, so `odsgd` means the defaults.

Writes OUT/convergence.json (per setting, mode and seed: final test accuracy, accuracy and
wall time per epoch; summary per mode), OUT/convergence.png (test accuracy against epoch and
against wall time, mean over seeds, band from min to max), and prints a Markdown table.
"""
import argparse
import json
import os
import sys
import tempfile
import time

from odsgd.common import config as store_config
from odsgd.bench.jobs import JobFailed, run_job

#: digits_job arguments of each setting, chosen with dist_sync (docs/convergence.md)
SETTINGS = {
    "mlp": {"description": "MLP 64-128-64-10, batch 16 per worker, SGD lr 0.05 momentum 0.9",
            "args": ["--model", "mlp", "--hidden", "128,64", "--batch-size", "16",
                     "--lr", "0.05", "--momentum", "0.9"]},
    "cnn": {"description": "CNN conv16-conv32-pool-64-10, batch 32 per worker, SGD lr 0.02 "
                           "momentum 0.9, wd 1e-4",
            "args": ["--model", "cnn", "--batch-size", "32", "--lr", "0.02",
                     "--momentum", "0.9", "--wd", "1e-4"]},
}
DEFAULT_MODES = "dist_sync,dist_async,odsgd:local_optimizer=predict,odsgd:local_optimizer=sgd"
_SETTING_TO_VARIABLE = {name: variable
                        for variable, (name, _parse) in store_config.ENVIRONMENT.items()}


def parse_mode(mode):
    """'dist_sync' -> ('dist_sync', {}); 'odsgd:warmup_steps=0' -> ('dist_odsgd',
    {'ODSGD_WARMUP_STEPS': '0', every other ODSGD_* variable: ''})."""
    if mode in ("dist_sync", "dist_async"):
        return mode, {}
    name, _, spec = mode.partition(":")
    if name != "odsgd":
        raise ValueError("unknown mode %r: use dist_sync, dist_async, odsgd or "
                         "odsgd:NAME=VALUE,..." % mode)
    env = {variable: "" for variable in store_config.ENVIRONMENT}
    for item in filter(None, spec.split(",")):
        key, sep, value = item.partition("=")
        if not sep or key not in _SETTING_TO_VARIABLE:
            raise ValueError("bad setting %r in mode %r; settings are %s"
                             % (item, mode, ", ".join(sorted(_SETTING_TO_VARIABLE))))
        env[_SETTING_TO_VARIABLE[key]] = value
    store_config.read_environment(env)   # a bad value fails here, not in a job
    return "dist_odsgd", env


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="python -m odsgd.bench convergence",
                                description=__doc__.splitlines()[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="\n".join(__doc__.splitlines()[2:]))
    p.add_argument("--settings", default="mlp,cnn",
                   help="comma separated, of: %s" % ", ".join(SETTINGS))
    p.add_argument("--modes", default=DEFAULT_MODES, help="comma separated; ';' also "
                   "separates, for modes whose settings contain commas")
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--epochs", type=int, default=15)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--servers", type=int, default=1)
    p.add_argument("--out", default="runs/convergence")
    p.add_argument("--timeout", type=float, default=600, help="seconds per job")
    p.add_argument("--reuse", action="store_true",
                   help="add to OUT/convergence.json: its runs that match (setting, mode, "
                   "seed, epochs, workers) are not run again, and its other runs are kept "
                   "(table, plot and summary cover them all)")
    args = p.parse_args(argv)
    args.settings = [s for s in args.settings.split(",") if s]
    unknown = [s for s in args.settings if s not in SETTINGS]
    if unknown:
        p.error("unknown setting(s) %s; choose from %s" % (unknown, ", ".join(SETTINGS)))
    args.modes = split_modes(args.modes)
    try:
        for mode in args.modes:
            parse_mode(mode)
    except ValueError as error:
        p.error(str(error))
    args.seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    return args


def split_modes(text):
    """Modes separated by ';', or by ',' where a comma does not continue NAME=VALUE pairs."""
    if ";" in text:
        return [m.strip() for m in text.split(";") if m.strip()]
    modes = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        if modes and modes[-1].startswith("odsgd:") and "=" in part and ":" not in part:
            modes[-1] += "," + part
        else:
            modes.append(part)
    return modes


def run_one(setting, mode, seed, args):
    """Runs one job; returns its record (see the module docstring)."""
    kvstore, env = parse_mode(mode)
    env = dict(env, OMP_NUM_THREADS="1")
    with tempfile.TemporaryDirectory() as folder:
        result_file = os.path.join(folder, "result.json")
        tic = time.time()
        run_job(["odsgd.bench.digits_job", "--kvstore", kvstore, "--seed", seed,
                 "--num-epochs", args.epochs, "--json", result_file]
                + SETTINGS[setting]["args"],
                workers=args.workers, servers=args.servers, timeout=args.timeout, env=env)
        job_seconds = time.time() - tic
        with open(result_file) as f:
            result = json.load(f)
    history = result["history"]
    return {"setting": setting, "mode": mode, "kvstore": kvstore, "seed": seed,
            "epochs": args.epochs, "workers": args.workers,
            "env": {k: v for k, v in env.items() if k.startswith("ODSGD_") and v},
            "final_test_accuracy": result["final_test_accuracy"],
            "accuracy_per_epoch": [h["test_accuracy"] for h in history],
            "wall_time_per_epoch": [h["wall_time"] for h in history],
            "wall_time": history[-1]["wall_time"], "job_seconds": job_seconds,
            "steps": result["steps"], "samples_per_sec": result["samples_per_sec"],
            "store": result.get("store")}


def _same_run(record, setting, mode, seed, args):
    return (record.get("setting") == setting and record.get("mode") == mode
            and record.get("seed") == seed and record.get("epochs") == args.epochs
            and record.get("workers") == args.workers and "error" not in record)


def run_all(args, previous=()):
    """Every (setting, mode, seed), one job at a time, with a progress line each; returns
    those runs after the runs of `previous` that are not in this plan."""
    plan = [(s, m, seed) for s in args.settings for m in args.modes for seed in args.seeds]
    runs = [r for r in previous
            if not any(_same_run(r, s, m, seed, args) for s, m, seed in plan)
            and "error" not in r]
    for number, (setting, mode, seed) in enumerate(plan, 1):
        kept = [r for r in previous if _same_run(r, setting, mode, seed, args)]
        if kept:
            runs.append(kept[0])
            continue
        try:
            record = run_one(setting, mode, seed, args)
            line = "%.2f%% (wall %.1f s, job %.1f s)" % (
                100 * record["final_test_accuracy"], record["wall_time"], record["job_seconds"])
        except JobFailed as failure:
            record = {"setting": setting, "mode": mode, "seed": seed, "epochs": args.epochs,
                      "workers": args.workers, "error": str(failure)[-2000:]}
            line = "FAILED: %s" % str(failure).splitlines()[0]
        runs.append(record)
        print("[%d/%d] %-4s %-45s seed %d: %s" % (number, len(plan), setting, mode, seed,
                                                   line), flush=True)
    return runs


def _mean(values):
    return sum(values) / len(values)


def summarize(runs):
    """{setting: {mode: {'mean', 'std', 'min', 'max', 'n', 'failed', 'wall_time'}}} of the
    final test accuracies, and each mode's distance to dist_sync and dist_async."""
    summary = {}
    for record in runs:
        entry = summary.setdefault(record["setting"], {}).setdefault(
            record["mode"], {"accuracies": [], "wall_times": [], "last3": [], "failed": 0})
        if "error" in record:
            entry["failed"] += 1
        else:
            entry["accuracies"].append(record["final_test_accuracy"])
            entry["wall_times"].append(record["wall_time"])
            entry["last3"].append(_mean(record.get("accuracy_per_epoch", [])[-3:]
                                        or [record["final_test_accuracy"]]))
    for modes in summary.values():
        for entry in modes.values():
            accs = entry.pop("accuracies")
            walls = entry.pop("wall_times")
            last3 = entry.pop("last3")
            if accs:
                mean = _mean(accs)
                # last3_mean: the last 3 epochs' accuracy, averaged (steadier than the final
                # epoch's where the rate does not decay)
                entry.update(mean=mean, min=min(accs), max=max(accs), n=len(accs),
                             std=(_mean([(a - mean) ** 2 for a in accs])) ** 0.5,
                             accuracies=accs, wall_time=_mean(walls),
                             last3_mean=_mean(last3))
        for entry in modes.values():
            for baseline in ("dist_sync", "dist_async"):
                if "mean" in entry and "mean" in modes.get(baseline, {}):
                    entry["minus_" + baseline] = entry["mean"] - modes[baseline]["mean"]
            if "minus_dist_sync" in entry and "minus_dist_async" in entry:
                # the target: >= dist_sync - 0.5 points and >= dist_async
                entry["meets_target"] = (entry["minus_dist_sync"] >= -0.005 - 1e-9
                                         and entry["minus_dist_async"] >= -1e-9)
    return summary


def markdown_table(summary, runs):
    """The summary as Markdown, one table per setting."""
    lines = []
    for setting, modes in summary.items():
        mine = [r for r in runs if r["setting"] == setting]
        lines += ["", "**%s** (%s; %s workers, %s epochs, seeds %s)"
                  % (setting, SETTINGS[setting]["description"],
                     ",".join(sorted({str(r["workers"]) for r in mine})),
                     ",".join(sorted({str(r["epochs"]) for r in mine})),
                     ",".join(map(str, sorted({r["seed"] for r in mine})))), "",
                  "| mode | final % (mean) | std | min–max % | per seed % | vs sync | vs async "
                  "| target | last 3 epochs % | wall s |",
                  "|---|---|---|---|---|---|---|---|---|---|"]
        for mode, e in modes.items():
            failed = " (%d failed)" % e["failed"] if e["failed"] else ""
            if "mean" not in e:
                lines.append("| %s%s | | | | | | | | | |" % (mode, failed))
                continue
            lines.append("| %s%s | %.2f | %.2f | %.2f–%.2f | %s | %s | %s | %s | %.2f | %.1f |"
                         % (mode, failed, 100 * e["mean"], 100 * e["std"], 100 * e["min"],
                            100 * e["max"], " ".join("%.1f" % (100 * a) for a in e["accuracies"]),
                            "%+.2f" % (100 * e["minus_dist_sync"])
                            if "minus_dist_sync" in e else "",
                            "%+.2f" % (100 * e["minus_dist_async"])
                            if "minus_dist_async" in e else "",
                            ("yes" if e["meets_target"] else "no")
                            if "meets_target" in e else "",
                            100 * e["last3_mean"], e["wall_time"]))
    return "\n".join(lines)


def plot(runs, path):
    """Test accuracy against epoch and against wall time, per setting (rows) and mode (mean
    over seeds; band from min to max). The y axis starts a little below the baselines' final
    accuracy: a mode far below it (diverged) leaves the plot, and the table says so."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    good = [r for r in runs if "error" not in r]
    settings = sorted({r["setting"] for r in good})
    if not settings:
        return None
    modes = []
    for r in good:
        if r["mode"] not in modes:
            modes.append(r["mode"])
    colours = {m: plt.get_cmap("tab20")(i % 20) for i, m in enumerate(modes)}
    fig, axes = plt.subplots(len(settings), 2, figsize=(13, 4.2 * len(settings) + 1.5),
                             squeeze=False)
    for row, setting in zip(axes, settings):
        finals = []
        for mode in modes:
            mine = [r for r in good if r["setting"] == setting and r["mode"] == mode]
            if not mine:
                continue
            epochs = min(len(r["accuracy_per_epoch"]) for r in mine)
            acc = [[100 * r["accuracy_per_epoch"][e] for r in mine] for e in range(epochs)]
            wall = [_mean([r["wall_time_per_epoch"][e] for r in mine]) for e in range(epochs)]
            mean = [_mean(a) for a in acc]
            x = list(range(1, epochs + 1))
            style = dict(color=colours[mode], marker=".", linewidth=1.6 if mode in (
                "dist_sync", "dist_async") else 1.0)
            row[0].plot(x, mean, label=mode, **style)
            row[0].fill_between(x, [min(a) for a in acc], [max(a) for a in acc],
                                color=colours[mode], alpha=0.12)
            row[1].plot(wall, mean, **style)
            if mode in ("dist_sync", "dist_async"):
                finals.append(mean[-1])
        seeds = len({r["seed"] for r in good if r["setting"] == setting})
        row[0].set(title="%s: test accuracy of the global weights (up to %d seeds)"
                   % (setting, seeds), xlabel="epoch", ylabel="test accuracy %")
        row[1].set(title="%s: test accuracy against wall time" % setting,
                   xlabel="seconds since training started (mean over seeds)",
                   ylabel="test accuracy %")
        low = max(0.0, min(finals) - 8) if finals else 0.0
        for ax in row:
            ax.grid(alpha=0.3)
            ax.set_ylim(low, 100)
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=2, fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0.03 + 0.022 * ((len(modes) + 1) // 2) / len(settings), 1, 1))
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return path


def main(argv=None):
    args = parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    json_path = os.path.join(args.out, "convergence.json")
    previous = []
    if args.reuse and os.path.exists(json_path):
        with open(json_path) as f:
            previous = json.load(f).get("runs", [])
    print("convergence study: settings %s, modes %s, seeds %s, %d epochs, %d workers, "
          "%d server(s)" % (",".join(args.settings), "; ".join(args.modes),
                            ",".join(map(str, args.seeds)), args.epochs, args.workers,
                            args.servers), flush=True)
    tic = time.time()
    runs = run_all(args, previous)
    summary = summarize(runs)
    report = {"command": "python -m odsgd.bench convergence " + " ".join(
                  sys.argv[1:] if argv is None else argv),
              "settings": {s: SETTINGS[s] for s in args.settings},
              "modes": args.modes, "seeds": args.seeds, "epochs": args.epochs,
              "workers": args.workers, "servers": args.servers,
              "total_seconds": time.time() - tic, "runs": runs, "summary": summary}
    with open(json_path, "w") as f:
        json.dump(report, f, indent=1)
    png = plot(runs, os.path.join(args.out, "convergence.png"))
    print(markdown_table(summary, runs))
    print("\nwrote %s%s (%.0f s)" % (json_path, " and %s" % png if png else "",
                                     time.time() - tic))
    return 1 if any("error" in r for r in runs) else 0
