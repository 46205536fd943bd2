"""Timelines of training steps, from MXNet's own profiler: what each worker's engine ran when
(compute, every push and pull in flight, the local update), on one time axis.

Recording: with `ODSGD_TIMELINE=PATH` set, `start_if_asked(rank)` (called by the store and by
the benchmark's job when they create their kvstore) starts MXNet's profiler in this worker
process, and the trace is written when the process ends (or at `stop_and_dump()`), one file
per worker (`trace_file`):

    PATH ending in .json      results/t.json -> results/t.rank0.json, results/t.rank1.json ...
    a folder (existing, or    results/tl/    -> results/tl/timeline.rank0.json ...
      PATH ending in /)
    anything else             results/t      -> results/t.rank0.json ...

Unset or empty, nothing happens: not even MXNet is imported.

Reading: `read_trace(file)` gives the engine's operations as `Event`s (name, kind, start_s,
end_s; seconds since the epoch, the system clock, so that the traces of processes on one
machine share an axis; across machines only as far as their clocks agree), `step_marks` one
mark per training step (the end of its `_backward*` operators), `steady_window` a few
steady-state steps, `busy_fraction` how much of a window a lane was busy.

What the trace holds (MXNet 1.9.1, measured; docs/benchmarks.md, "Timeline"): every engine
operation with its start and its end; an asynchronous operation (the dist kvstore's push and
pull) ends in its completion callback, i.e. when the server's answer arrived, so its span is
the time it was in flight. The names, by kind:

* push: `KVStoreDistDefaultPush` (kv.push). Under dist_sync's servers the answer to a push
  comes once every worker's push of that round was applied.
* pull: `KVStoreDistDefaultStoragePull` (kv.pull).
* pushpull: `KVStoreDistDefaultStoragePushPull`: Gluon's Trainer under dist_sync and
  dist_async, and dist_odsgd's rounds (one per part of a key group, odsgd/worker/exchange.py), send
  a key's gradient and receive its new weights in one request (ps-lite's ZPushPull), one
  operation from the gradient's send to the weights' arrival: push and pull are in flight
  together, and the trace cannot split them.
* local_update: the project's fused local update operators (`odsgd_multi_*update`).
* copy: `CopyCPU2CPU` and the other `Copy*` operations, the store's packing of key groups
  (`odsgd_gather`, `odsgd_scatter`).
* other: the engine's bookkeeping (`DeleteVariable`, `WaitForVar`, ...).
* compute: everything else: the model's forward and backward (a hybridized block runs in
  segments, each one event named by its operators, e.g. `Activation,FullyConnected,Activation`
  and `_backward_Activation,_backward_FullyConnected,...`, or `ImperativeBulk`, which is also
  the name of bulked imperative operations such as the loss's), and the store's few tiny
  operators (fences, fills; microseconds each).
"""
import atexit
import collections
import functools
import json
import math
import os
import statistics

#: the kinds of events, in the order of the picture's lanes
KINDS = ("compute", "push", "pull", "pushpull", "local_update", "copy", "other")

#: the lanes of a worker in the picture: (label, kinds drawn and counted in it). A pushpull
#: is a push and a pull in flight at once, so it fills both lanes.
LANES = (("compute", ("compute", "copy")),
         ("push in flight", ("push", "pushpull")),
         ("pull in flight", ("pull", "pushpull")),
         ("local update", ("local_update",)))

#: engine operations that are bookkeeping, not work on data
_BOOKKEEPING = frozenset(["DeleteVariable", "DeleteOperator", "WaitForVar", "WaitForAll",
                          "ResourceParallelRandomSetSeed"])
_PACKING = frozenset(["odsgd_gather", "odsgd_scatter"])

Event = collections.namedtuple("Event", "name kind start_s end_s")
Window = collections.namedtuple("Window", "start_s end_s marks")

_recording = {"file": None}     # the trace this process is recording, if any


# -- recording ----------------------------------------------------------------------------
def trace_file(path, rank):
    """The trace file of worker `rank` for ODSGD_TIMELINE=`path` (naming in the docstring
    of this module)."""
    if path.endswith(("/", os.sep)) or os.path.isdir(path):
        return os.path.join(path, "timeline.rank%d.json" % rank)
    if path.endswith(".json"):
        return "%s.rank%d.json" % (path[:-len(".json")], rank)
    return "%s.rank%d.json" % (path, rank)


def start_if_asked(rank, environ=None):
    """Starts MXNet's profiler for this worker when ODSGD_TIMELINE is set; returns the trace
    file, or None (and does nothing) when it is not. A second call is a no-op: the store and
    a job script may both call it."""
    from ..common.config import timeline_path
    path = timeline_path(environ)
    if path is None:
        return None
    if _recording["file"] is not None:
        return _recording["file"]
    filename = trace_file(os.path.abspath(path), rank)
    os.makedirs(os.path.dirname(filename), exist_ok=True)
    import mxnet as mx
    # Operators only (imperative and hybridized): the C-API and memory counters would
    # multiply the trace's size and the profiler's cost without showing more of a step.
    mx.profiler.set_config(profile_symbolic=True, profile_imperative=True,
                           profile_memory=False, profile_api=False, aggregate_stats=False,
                           filename=filename)
    mx.profiler.set_state("run")
    _recording["file"] = filename
    # Registered after `import mxnet`, so it runs before MXNet's own exit handler (atexit is
    # last in, first out), while the engine still runs.
    atexit.register(stop_and_dump)
    return filename


def stop_and_dump():
    """Stops the profiler and writes the trace; returns its file (None if not recording)."""
    filename = _recording["file"]
    if filename is None:
        return None
    _recording["file"] = None
    import mxnet as mx
    try:
        # operations still in flight get their end before the trace is written
        mx.nd.waitall()
    except Exception:  # noqa: BLE001 - a failed operation must not lose the trace
        pass
    mx.profiler.set_state("stop")
    mx.profiler.dump()
    return filename


# -- reading ------------------------------------------------------------------------------
def kind_of(name):
    """The kind (KINDS) of an engine operation named `name`."""
    if name.startswith("KVStore"):
        if "PushPull" in name:
            return "pushpull"
        if "Push" in name:
            return "push"
        if "Pull" in name:
            return "pull"
        return "other"
    if name.startswith("odsgd_") and name.endswith("update"):
        return "local_update"
    if name.startswith("Copy") or name in _PACKING:
        return "copy"
    if name in _BOOKKEEPING:
        return "other"
    return "compute"


def read_trace(path):
    """The operations of a Chrome-trace JSON file (MXNet's profiler dump) as Events, sorted
    by start. Duration events ('B'/'E' pairs, or 'X' with 'dur') of the 'operator' category
    (or none); MXNet writes each operation twice, as a duration and as an async ('b'/'e')
    event: the async copy is used only where a trace has no duration events."""
    try:
        with open(path) as f:
            data = json.load(f)
    except ValueError as error:
        raise ValueError("%s is not a JSON trace (%s); was the worker ended before it "
                         "wrote it?" % (path, error))
    raw = data.get("traceEvents", []) if isinstance(data, dict) else data
    if not isinstance(raw, list):
        raise ValueError("%s holds no list of trace events" % path)
    operators = [e for e in raw if isinstance(e, dict) and "name" in e and "ts" in e
                 and e.get("cat", "operator") == "operator"]
    spans = _pair(operators, "B", "E") + _complete(operators)
    if not spans:
        spans = _pair(operators, "b", "e")
    events = [Event(name, kind_of(name), start / 1e6, end / 1e6) for name, start, end in spans]
    return sorted(events, key=lambda e: (e.start_s, e.end_s))


def _pair(raw, begin, end):
    """(name, start_us, end_us) of begin/end pairs, in the file's order: an end closes the
    latest open begin of the same name on the same pid and tid. MXNet writes each
    operation's begin and end together, while its asynchronous operations overlap in time on
    one thread: paired by time, as a trace viewer does, they would be mixed up."""
    open_slices, spans = {}, []
    for e in raw:
        key = (e.get("pid"), e.get("tid"), e["name"])
        if e.get("ph") == begin:
            open_slices.setdefault(key, []).append(e["ts"])
        elif e.get("ph") == end and open_slices.get(key):
            spans.append((e["name"], open_slices[key].pop(), e["ts"]))
    return spans


def _complete(raw):
    return [(e["name"], e["ts"], e["ts"] + e.get("dur", 0)) for e in raw if e.get("ph") == "X"]


# -- steps and windows --------------------------------------------------------------------
def step_marks(events, steps=None):
    """One mark per training step, in order (seconds): the end of the step's backward
    operators named `_backward*` (one or several per step, each step's after the previous
    step's). Not necessarily the end of the whole backward pass (a segment may run as
    `ImperativeBulk`), but the same point of every step: the marks' spacing is the step
    time. With `steps` given, the operators are
    split into that many equal runs; without, the number of steps is the greatest common
    divisor of how often each backward name occurs (every name occurs a whole number of
    times per step). Raises ValueError when the trace has no backward operators."""
    backward = sorted((e for e in events if e.kind == "compute"
                       and e.name.startswith("_backward")), key=lambda e: e.start_s)
    if not backward:
        raise ValueError("the trace has no backward operators (_backward*): was a step "
                         "recorded, with a hybridized model?")
    if steps is None:
        counts = collections.Counter(e.name for e in backward).values()
        steps = functools.reduce(math.gcd, counts)
    if steps < 1 or len(backward) % steps:
        raise ValueError("%d backward operators do not split into %d steps"
                         % (len(backward), steps))
    per_step = len(backward) // steps
    return [max(e.end_s for e in backward[i * per_step:(i + 1) * per_step])
            for i in range(steps)]


def steady_window(marks, steps=4):
    """A window of `steps` consecutive steps in the steady state: from one of the `marks`
    (step_marks) to the one `steps` later. The first third of the run (start-up, warm-up) and the
    last step (the job's final wait and exit) are left out; of the windows left, the one of
    median length is taken, so that a stray slow or fast step does not pick the picture."""
    if steps < 1:
        raise ValueError("a window needs at least 1 step, got %d" % steps)
    first = max(1, len(marks) // 3)
    last = len(marks) - 2 - steps          # the window's first mark, at the latest
    if last < first:
        raise ValueError("a window of %d steady steps needs a longer run: the trace has %d "
                         "steps, at least %d are needed" % (steps, len(marks),
                                                            _steps_needed(steps)))
    lengths = sorted((marks[i + steps] - marks[i], i) for i in range(first, last + 1))
    i = lengths[len(lengths) // 2][1]
    return Window(marks[i], marks[i + steps], marks[i:i + steps + 1])


def mean_step_seconds(marks):
    """Mean time between steps over the steady run: the marks that steady_window draws from
    (the first third and the last step left out)."""
    first, last = max(1, len(marks) // 3), len(marks) - 2
    if last <= first:
        raise ValueError("too few steps (%d) for a steady-state step time" % len(marks))
    return (marks[last] - marks[first]) / (last - first)


def _steps_needed(steps):
    """The shortest run steady_window takes for a window of `steps` steps."""
    count = steps + 3
    while count - 2 - steps < max(1, count // 3):
        count += 1
    return count


def in_window(events, start_s, end_s):
    """The events that overlap [start_s, end_s], clipped to it."""
    return [e._replace(start_s=max(e.start_s, start_s), end_s=min(e.end_s, end_s))
            for e in events if e.end_s > start_s and e.start_s < end_s]


def busy_fraction(events, kinds, start_s, end_s):
    """The share of [start_s, end_s] in which at least one event of `kinds` ran (the union
    of their spans: overlapping pushes of several keys count once)."""
    if end_s <= start_s:
        raise ValueError("empty window [%r, %r]" % (start_s, end_s))
    spans = sorted((e.start_s, e.end_s) for e in in_window(events, start_s, end_s)
                   if e.kind in kinds)
    busy, reach = 0.0, start_s
    for begin, end in spans:
        begin = max(begin, reach)
        if end > begin:
            busy += end - begin
            reach = end
    return busy / (end_s - start_s)


def lane_fractions(events, start_s, end_s):
    """{lane label: busy_fraction} for the LANES of a worker."""
    return {label: busy_fraction(events, kinds, start_s, end_s) for label, kinds in LANES}


# -- rounds across workers ------------------------------------------------------------------
Round = collections.namedtuple("Round", "issued_s answered_s")


def rounds_of(events, parts):
    """One worker's push-with-pull requests (kind "pushpull") as rounds of `parts` requests:
    (issue, answer) times in seconds, an array-like [round][part] each, in issue order. Valid
    where every step sends the same `parts` requests in the same order (dist_odsgd's parts
    of its key groups; Gluon's Trainer's keys). Raises ValueError where the count of requests
    is no whole number of rounds."""
    requests = sorted((e for e in events if e.kind == "pushpull"), key=lambda e: e.start_s)
    if parts < 1 or not requests or len(requests) % parts:
        raise ValueError("%d push-with-pull requests do not split into rounds of %d parts; "
                         "give --parts the requests one step sends" % (len(requests), parts))
    count = len(requests) // parts
    return Round([[e.start_s for e in requests[r * parts:(r + 1) * parts]] for r in range(count)],
                 [[e.end_s for e in requests[r * parts:(r + 1) * parts]] for r in range(count)])


def answer_spread(worker_events, parts):
    """How far apart the workers receive the answers of the same request, round by round.
    `worker_events`: one list of Events per worker (read_trace), whose requests are rounds of
    `parts` (rounds_of), the same number of rounds each. Per round, a dict of seconds:
    `part_spread_median` and `part_spread_max`, over the round's parts, of (latest - earliest
    arrival of that part's answer across the workers); `last_answer_spread`, the same of the
    workers' last answers; `round_trip`, the earliest issue of the round's first part to the
    latest arrival of any of its answers. A server answers a part to every worker at once
    (when the last worker's push is in), so a spread is time the answers spent on their way:
    queued behind other answers in the server's sockets and NIC."""
    rounds = [rounds_of(events, parts) for events in worker_events]
    counts = {len(r.issued_s) for r in rounds}
    if len(counts) != 1:
        raise ValueError("the workers recorded different numbers of rounds: %s"
                         % sorted(len(r.issued_s) for r in rounds))
    result = []
    for i in range(counts.pop()):
        answered = [r.answered_s[i] for r in rounds]        # [worker][part]
        spreads = sorted(max(a[k] for a in answered) - min(a[k] for a in answered)
                         for k in range(parts))
        last = [max(a) for a in answered]
        result.append({"part_spread_median": statistics.median(spreads),
                       "part_spread_max": spreads[-1],
                       "last_answer_spread": max(last) - min(last),
                       "round_trip": max(last) - min(r.issued_s[i][0] for r in rounds)})
    return result

