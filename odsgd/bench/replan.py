"""`python -m odsgd.bench replan FILE...`: the step model's predictions of recorded
throughput runs computed again from their recorded inputs, after a change of the model
(odsgd/bench/step_model.py), so that a results JSON's `plan_*` and `predicted_*` fields are
today's model's, as the tests and docs compare them. Only the predictions change: every
measured field, and the recorded inputs (t_comp, the CPU per step, the link, s), stay.

    python -m odsgd.bench replan results/paper_cluster_*.json results/throughput_hosts_34_*.json

Prints each run's old and new prediction and the measured rate over the new one; --check
writes nothing and exits 1 where a file's predictions are not today's.
"""
import argparse
import json
import sys

from . import throughput

def per_step(run):
    """Samples a step of the whole job, N B."""
    return run["workers"] * run["batch_size"]


def run_shaped_mbit(run):
    """The rate the run's NICs were shaped to (accelerator-paced runs scale it down)."""
    return run.get("shaped_mbit") or run["bandwidth_mbit"]


def replanned(run):
    """The run's prediction fields under today's step model, from its recorded inputs."""
    fields = {}
    if "plan_share" in run:
        fields.update(throughput.plan_fields(run, per_step(run), run_shaped_mbit(run),
                                             shares={run["mode"]: run["plan_share"]}))
    if run.get("predicted_samples_per_sec"):
        fields.update(throughput.prediction_fields(run, per_step(run), run_shaped_mbit(run)))
    return fields


def same_value(old, new):
    """Whether a recorded prediction field equals today's: numbers to 1e-9 (relative), lists
    and dicts entry by entry, anything else exactly."""
    if isinstance(new, bool) or isinstance(old, bool):
        return old == new
    if isinstance(new, (int, float)) and isinstance(old, (int, float)):
        return abs(new - old) <= 1e-9 * max(abs(new), abs(old))
    if isinstance(new, (list, tuple)) and isinstance(old, (list, tuple)):
        return len(old) == len(new) and all(same_value(a, b) for a, b in zip(old, new))
    if isinstance(new, dict) and isinstance(old, dict):
        return old.keys() == new.keys() and all(same_value(old[k], new[k]) for k in new)
    return old == new


def replan_file(path, write=True):
    """[(mode, bandwidth, measured, old, new samples/s, the names of the fields whose recorded
    value is not today's)] of the runs of `path` with predictions; writes today's predictions
    back where `write`."""
    with open(path) as f:
        document = json.load(f)
    rows = []
    for run in document.get("runs", []):
        fields = replanned(run)
        if not fields:
            continue
        key = "plan_samples_per_sec" if "plan_samples_per_sec" in fields \
            else "predicted_samples_per_sec"
        stale = sorted(name for name, value in fields.items()
                       if not same_value(run.get(name), value))
        rows.append((run["mode"], run["bandwidth_mbit"], run["samples_per_sec"],
                     run.get(key), fields[key], stale))
        run.update(fields)
    if write:
        with open(path, "w") as f:
            json.dump(document, f, indent=1)      # as odsgd.bench throughput writes it
    return rows


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m odsgd.bench replan", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("files", nargs="+", help="results JSON of `odsgd.bench throughput`")
    p.add_argument("--check", action="store_true",
                   help="write nothing; exit 1 where a prediction is not today's model's")
    args = p.parse_args(argv)
    stale = 0
    for path in args.files:
        rows = replan_file(path, write=not args.check)
        print("%s: %d runs with predictions" % (path, len(rows)))
        for mode, mbit, measured, old, new, fields in rows:
            stale += bool(fields)
            print("  %-10s %8g Mbit/s  measured %9.1f  predicted %9s -> %9.1f  (x %.3f)%s"
                  % (mode, mbit, measured, "-" if old is None else "%.1f" % old, new,
                     measured / new, "  changed: " + ", ".join(fields) if fields
                     else "  unchanged"))
    if args.check and stale:
        print("%d predictions are not today's model's: run without --check" % stale)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
