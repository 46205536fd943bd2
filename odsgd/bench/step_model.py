"""The step model of dist_sync, dist_async and dist_odsgd: one step's time from the
computation t_comp and the link, the one place of the formulas that `odsgd.bench throughput`
(its predicted column) and `odsgd.bench plan` use.

Inputs: t_comp (one worker's forward and backward), t_link (one step's bytes through the
busiest direction of the busiest shaped queue, odsgd.bench.jobs.link_step_seconds, at the
share of the rate that TCP payload can fill: payload_share), push and pull
(push_pull_seconds) and s, the largest server key's share of the parameters (the answer
the chain waits for last: largest_key_share for dist_odsgd, sync_key_share for MXNet's own
stores). docs/benchmarks.md, "Accelerator-paced workers and the planner", derives them and
shows how they fit the measured tables.
"""
from ..common import config as store_config
from .jobs import TOPOLOGIES, link_bytes_per_sec, link_step_seconds, step_wire_bytes

MODES = ("dist_sync", "dist_async", "dist_odsgd")

#: t_link of each topology, N workers, S servers, M bytes of parameters, R bytes/s per queue
#: (link_bytes_per_sec: one NIC direction on hosts, the one loopback queue)
LINK_FORMULA = {"hosts": "max(M/R, N*M/(S*R))", "loopback": "2*N*M/R"}

#: each mode's step time, as printed beside its prediction
FORMULAS = {"dist_sync": "t_comp + max(push + s * pull, t_link)",
            "dist_async": "min(t_comp + t_link, MVA of N workers on the busiest NIC)",
            "dist_odsgd": "max(t_comp, t_link, (push + s * pull + t_comp) / 2)"}


#: bytes of a TCP segment's headers (IPv4 20, TCP 20, its timestamp option 12): MSS = MTU - 52
TCP_IP_HEADER_BYTES = 52
#: bytes a frame costs on the link beyond its IP packet: the emulated hosts' shaper (tc)
#: counts the Ethernet header only (`python -m odsgd.bench goodput` measures it); a real
#: Ethernet wire also carries the frame check (4), the preamble (8) and the gap (12)
EMULATED_FRAME_BYTES = 14
ETHERNET_FRAME_BYTES = 38


def payload_share(mtu=1500, frame_bytes=EMULATED_FRAME_BYTES, mss=None):
    """The share of a link's rate that TCP payload can fill: MSS bytes in every frame of
    MTU + frame_bytes (docs/benchmarks.md, "What the link carries"; MSS = MTU - 52 unless
    given)."""
    mss = mtu - TCP_IP_HEADER_BYTES if mss is None else mss
    return mss / float(mtu + frame_bytes)


def topology_payload_share(topology):
    """payload_share of the emulated hosts' NICs (MTU 1500); 1.0 on the shaped loopback,
    whose segments of up to 64 KiB carry headers of a thousandth of them."""
    return payload_share() if topology == "hosts" else 1.0


def push_pull_seconds(topology, workers, servers, parameter_bytes, bandwidth_mbit,
                      payload=None):
    """(push, pull): one step's time of its pushes and of its pulls on the busiest shaped
    queue each passes, R = link_bytes_per_sec x `payload` (the payload's share of the rate,
    default topology_payload_share); None unshaped.

    hosts: the pushes go out of the workers' NICs and into the servers', the pulls the other
    way, each on the other direction of a full-duplex NIC: each direction's busiest queue
    carries max(M, N*M/S) of them, so push = pull = max(M/R, N*M/(S*R)) = t_link (one
    direction's time, link_step_seconds). loopback: the one shaped queue carries both, N*M of
    each: push = pull = N*M/R, push + pull = t_link = 2*N*M/R."""
    rate = link_bytes_per_sec(bandwidth_mbit)
    if rate is None:
        return None
    rate *= topology_payload_share(topology) if payload is None else payload
    if topology == "hosts":
        one_way = step_wire_bytes(topology, workers, servers, parameter_bytes) / rate
        return one_way, one_way
    if topology == "loopback":
        return workers * parameter_bytes / rate, workers * parameter_bytes / rate
    raise ValueError("topology must be one of %s, got %r" % (", ".join(TOPOLOGIES), topology))


def link_times(topology, workers, servers, parameter_bytes, bandwidth_mbit, payload=None):
    """(t_link, push, pull) of one step in seconds (link_step_seconds, push_pull_seconds),
    the payload at `payload` of the rate (default topology_payload_share); (0, 0, 0)
    unshaped, where the model has only the computation (and the CPU) left."""
    payload = topology_payload_share(topology) if payload is None else payload
    times = push_pull_seconds(topology, workers, servers, parameter_bytes, bandwidth_mbit,
                              payload)
    if times is None:
        return 0.0, 0.0, 0.0
    return (link_step_seconds(topology, workers, servers, parameter_bytes, bandwidth_mbit)
            / payload,) + times


def odsgd_step_seconds(t_comp, one_direction, push, pull, last_share=1.0):
    """dist_odsgd's step time in its model: T = max(t_comp, one_direction,
    (push + last_share * pull + t_comp) / 2).

    Each of the three is a lower bound: a worker computes one step after another (t_comp);
    the busiest queue carries one step's bytes in each step (one_direction, the link bound's
    t_link); and with the one-step delay, step t's push, the servers' answer to it (its
    pull) and the computation of the step that needs those weights (step t + 2 starts from
    round t's global weights) form a chain that two steps' time must hold. The step's keys
    travel as separate requests (odsgd/worker/exchange.py), so the answers of the first keys come
    back while the later keys' gradients still go out: the chain waits for the whole push
    and the answer of the last key only, `last_share` of the pull (the largest key's share of
    the parameters, largest_key_share; 1 for one key):
    t_comp + push + last_share * pull <= 2 T."""
    return max(t_comp, one_direction, (push + last_share * pull + t_comp) / 2.0)


def sync_step_seconds(t_comp, one_direction, push, pull, last_share=1.0):
    """dist_sync's step time: T = t_comp + max(push + s * pull, t_link). A worker computes,
    then sends every key's gradient in one request per key (Gluon's pushpull); the servers
    answer a key once every worker's gradient of it is in, so the answers of the first keys
    travel while later keys still go out, and the step ends with the last answer: the whole
    push and the largest key's share s of the pull after t_comp, and never less than the
    step's bytes through the busiest queue (on one shaped loopback push and pull share it:
    t_link = push + pull)."""
    return t_comp + max(push + last_share * pull, one_direction)


def async_step_seconds(t_comp, one_direction, workers=None):
    """dist_async's step time: the shorter of two pictures of N workers that each wait for
    their own answers only.

    In phase (fitted to the measured 2-worker tables, docs/benchmarks.md): the workers'
    pushes meet in the servers' NICs, and a worker's round trip takes as long as the busiest
    queue's whole step, T = t_comp + t_link.

    Spread out (`workers` given): the busiest NIC's two directions are queues that N workers
    visit once a step each, with a demand of t_link / N per visit (one worker's bytes), and
    between visits each computes for t_comp: a closed queueing network, whose rate exact
    mean-value analysis gives (spread_async_step_seconds). With 8 and 12 workers on one
    server's NIC the workers drift apart and the measured rate is this one (1255 and 1389
    samples/s predicted, 1265 and 1384 measured, docs/benchmarks.md); with 2 workers the
    analysis, which assumes exponential times, queues more than fixed-size messages do, and
    the first picture holds."""
    in_phase = t_comp + one_direction
    if not workers or not one_direction:
        return in_phase
    return min(in_phase, spread_async_step_seconds(t_comp, one_direction, workers))


def spread_async_step_seconds(t_comp, one_direction, workers):
    """One worker's step time N / X in the closed network of async_step_seconds: N workers,
    a think time t_comp, two queueing stations (the busiest NIC's directions) of demand
    D = t_link / N per visit. Exact mean-value analysis: for n = 1..N, each station's
    residence R = D (1 + Q(n - 1)), X(n) = n / (t_comp + sum R), Q(n) = X(n) R."""
    demand = one_direction / float(workers)
    queue = [0.0, 0.0]
    rate = 0.0
    for n in range(1, workers + 1):
        residence = [demand * (1.0 + q) for q in queue]
        rate = n / (t_comp + sum(residence))
        queue = [rate * r for r in residence]
    return workers / rate


def predicted_samples_per_sec(per_step, t_comp, one_direction, push, pull, last_share=1.0):
    """Samples/s of the whole job (`per_step` = N B samples a step) at odsgd_step_seconds."""
    return per_step / odsgd_step_seconds(t_comp, one_direction, push, pull, last_share)


def largest_key_share(sizes, fusion_elements, part_elements):
    """The largest server key's share of the parameters (elements) when dist_odsgd packs
    arrays of `sizes` elements (in the store's order) into key groups of at most
    `fusion_elements` and cuts each into parts of at most `part_elements`
    (odsgd/worker/key_plan.py, odsgd/worker/key_groups.py); 1.0 for no arrays."""
    from ..worker.key_groups import part_bounds
    from ..worker.key_plan import plan_fusion
    total = sum(sizes)
    if not total:
        return 1.0
    groups = plan_fusion(sizes, [None] * len(sizes), fusion_elements)
    largest = max(size for group in groups
                  for _, size in part_bounds(sum(sizes[p] for p in group), part_elements))
    return largest / float(total)


def sync_key_share(sizes, servers, bigarray_bound):
    """The largest server key's share of the parameters under MXNet's dist_sync and
    dist_async: one key per array, and an array of `bigarray_bound` elements or more
    (MXNET_KVSTORE_BIGARRAY_BOUND) sliced evenly over the `servers` (kvstore_dist.h,
    EncodeDefaultKey); 1.0 for no arrays."""
    total = sum(sizes)
    if not total:
        return 1.0
    largest = max(-(-size // servers) if size >= bigarray_bound else size for size in sizes)
    return largest / float(total)


def mode_shares(sizes, servers, environ=None):
    """{mode: s} for arrays of `sizes` elements (in the Trainer's order): dist_odsgd's
    largest key under the store's fusion and part sizes, MXNet's stores' under its big-array
    bound, all read from `environ` (default the process's; odsgd/common/config.py); {} without
    sizes (each s is then 1, the whole pull)."""
    if not sizes:
        return {}
    mxnet_share = sync_key_share(sizes, servers, store_config.bigarray_bound(environ))
    return {"dist_sync": mxnet_share, "dist_async": mxnet_share,
            "dist_odsgd": largest_key_share(sizes, store_config.fusion_elements(environ),
                                            store_config.part_elements(environ))}


def model_compute_seconds(t_comp, cpu_seconds_per_step=None, cores=None):
    """The computation time of a step for dist_odsgd's step model: the larger of `t_comp`
    (one step's forward and backward alone in one process on an otherwise idle machine, as
    measured by measure_compute: what a worker's computation takes at least) and, where the
    CPU meter measured the mode, its CPU seconds per step over the cores (the time the
    machine's cores need for the CPU work of one step of every process of the job: the
    workers' computation with its local update and copies, the servers' sums and updates,
    the TCP copies). The first binds where cores are plentiful, the second where the job's
    processes share few cores, as on the 2-core machine of docs/benchmarks.md, where t_comp
    alone would leave out the contention that every mode runs under."""
    if cpu_seconds_per_step and cores:
        return max(t_comp, cpu_seconds_per_step / cores)
    return t_comp


def mode_step(mode, t_comp, one_direction, push, pull, share=1.0, cpu_seconds=0.0,
              workers=None):
    """(step seconds, what binds) of `mode`. `cpu_seconds`: the job's CPU seconds per step
    over its cores, where measured (0 for the planner: a cluster's own cores). dist_odsgd
    takes it into t_comp (model_compute_seconds, as its recorded predictions did); the
    others as a bound of its own, max(T, cpu_seconds), which fits their measured tables.
    `workers`: N, for dist_async's spread-out workers (async_step_seconds)."""
    if mode == "dist_odsgd":
        t_comp = max(t_comp, cpu_seconds)
        terms = {"compute": t_comp, "link": one_direction,
                 "chain": (push + share * pull + t_comp) / 2.0}
        return odsgd_step_seconds(t_comp, one_direction, push, pull, share), \
            max(terms, key=terms.get)
    if mode == "dist_sync":
        step = sync_step_seconds(t_comp, one_direction, push, pull, share)
    elif mode == "dist_async":
        step = async_step_seconds(t_comp, one_direction, workers)
    else:
        raise ValueError("mode must be one of %s, got %r" % (", ".join(MODES), mode))
    if cpu_seconds > step:
        return cpu_seconds, "cpu"
    if mode == "dist_async" and step < t_comp + one_direction:
        # the spread-out workers (async_step_seconds): the NIC's queues and the computation
        # overlap
        return step, ("link" if one_direction >= t_comp else "compute") + " (spread out)"
    return step, ("link" if step - t_comp >= t_comp else "compute") + " (in series)"


def spread_workers(topology, workers):
    """predict_modes' `spread_workers`: N on hosts (a queue per NIC direction), None on the
    one shaped loopback queue, where push and pull share a queue the analysis does not
    describe."""
    return workers if topology == "hosts" else None


def predict_modes(link, per_step, t_comp, shares, cpu_seconds=0.0, modes=MODES,
                  spread_workers=None):
    """{mode: prediction} for a job whose link is `link` ((one_direction, push, pull) in
    seconds; (0, 0, 0) unshaped), `per_step` samples a step (N B), computation t_comp and
    `shares` {mode: s}. `spread_workers`: N on emulated or real hosts, where the busiest NIC
    has a queue per direction that dist_async's workers may spread over (async_step_seconds;
    None on the one shaped loopback queue). A prediction holds plan_step_seconds,
    plan_samples_per_sec, plan_binds (compute, link, chain or cpu; "(in series)" or, for
    dist_async's spread-out workers, "(spread out)" after the first two) and plan_formula."""
    one_direction, push, pull = link
    result = {}
    for mode in modes:
        share = shares.get(mode, 1.0)
        step, binds = mode_step(mode, t_comp, one_direction, push, pull, share, cpu_seconds,
                                spread_workers)
        result[mode] = {"plan_step_seconds": step,
                        "plan_samples_per_sec": per_step / step if step > 0 else None,
                        "plan_binds": binds, "plan_share": share,
                        "plan_formula": FORMULAS[mode]}
    return result
