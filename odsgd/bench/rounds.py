"""`python -m odsgd.bench rounds`: how far apart the workers receive the answers of each
round, from timelines recorded with ODSGD_TIMELINE (odsgd/worker/trace.py), e.g. during a
throughput run:

    ODSGD_TIMELINE=runs/tl/ python -m odsgd.bench throughput --topology hosts ... \\
        --modes dist_odsgd --repeats 1
    python -m odsgd.bench rounds runs/tl/ --parts 115

A server answers a part of a round to every worker at once, when the last worker's push of
it is in; a spread between the workers' arrivals of one answer is time spent on the way back
(queued in the server's sockets and NIC), and every round after it waits for the slowest
worker. `--parts`: the requests one step sends (dist_odsgd: the parts of its key groups;
`KVStoreDistDefaultStoragePushPull` operations per step in a trace).
"""
import argparse
import glob
import json
import os
import statistics

from ..worker import trace as timeline


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="python -m odsgd.bench rounds", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("traces", nargs="+",
                   help="one trace per worker (timeline.rank<k>.json), or their folder")
    p.add_argument("--parts", type=int, required=True, help="requests one step sends")
    p.add_argument("--skip", type=int, default=None,
                   help="rounds left out first (default: the first third, start-up)")
    p.add_argument("--json", default=None, help="write the rounds and the summary here")
    return p.parse_args(argv)


def trace_files(paths):
    """The trace files of `paths`: files as given, folders' traces (timeline.trace_file's
    names, `*.rank<k>.json`) in name order, so that a --json written there is not read."""
    files = []
    for path in paths:
        if os.path.isdir(path):
            found = sorted(glob.glob(os.path.join(path, "*.rank*.json")))
            if not found:
                raise SystemExit("%s holds no trace (*.rank<k>.json); record one with "
                                 "ODSGD_TIMELINE=%s/" % (path, path.rstrip("/")))
            files += found
        else:
            files.append(path)
    if len(files) < 2:
        raise SystemExit("give the traces of at least 2 workers, not %d" % len(files))
    return files


def summary(rounds, skip=None):
    """Medians over the steady rounds (the first `skip`, default a third, and the last one
    left out: start-up and the job's end) of each of answer_spread's figures, in seconds."""
    skip = len(rounds) // 3 if skip is None else skip
    steady = rounds[skip:-1]
    if not steady:
        raise ValueError("no steady rounds: %d recorded, %d skipped and the last left out"
                         % (len(rounds), skip))
    return dict({key: statistics.median(r[key] for r in steady) for key in steady[0]},
                rounds=len(steady))


def main(argv=None):
    args = parse_args(argv)
    files = trace_files(args.traces)
    try:
        rounds = timeline.answer_spread([timeline.read_trace(f) for f in files], args.parts)
        steady = summary(rounds, args.skip)
    except ValueError as error:
        raise SystemExit(str(error))
    print("%d workers, %d rounds of %d parts (ms)" % (len(files), len(rounds), args.parts))
    print("round  round trip  part spread: median    max  last answers' spread")
    for i, r in enumerate(rounds):
        print("%5d  %10.0f  %19.0f  %5.0f  %20.0f" % (
            i, 1e3 * r["round_trip"], 1e3 * r["part_spread_median"],
            1e3 * r["part_spread_max"], 1e3 * r["last_answer_spread"]))
    print("steady rounds (%d), medians: round trip %.0f ms, a part's answers %.0f ms apart "
          "(largest %.0f), the last answers %.0f ms apart" % (
              steady["rounds"], 1e3 * steady["round_trip"], 1e3 * steady["part_spread_median"],
              1e3 * steady["part_spread_max"], 1e3 * steady["last_answer_spread"]))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"traces": [os.path.basename(t) for t in files], "parts": args.parts,
                       "rounds": rounds, "steady": steady}, f, indent=1)
        print("wrote %s" % args.json)
    return 0
