"""`python -m odsgd.bench plan`: the samples/s that dist_sync, dist_async and dist_odsgd
should reach on a cluster, and what binds each (compute, link, or dist_odsgd's one-step-delay
chain), from the step model the throughput benchmark prints beside its measurements
(odsgd/bench/step_model.py):

    python -m odsgd.bench plan --model resnet50_v1 --workers 16 --servers 4 --gbit 25 \\
        --device v100

One NIC per worker and per server, each direction at --gbit (the emulated hosts of
`throughput --topology hosts`), of which TCP's payload fills MSS / (MTU + --frame-bytes):
0.941 on a real Ethernet wire at MTU 1500, 0.956 on the emulated hosts (--frame-bytes 14).
The computation comes from --step-ms, else from --step-times (measured step times per
model), else from --device (published figures, odsgd/bench/device_profiles.py). --workers
and --gbit take comma-separated lists.
"""
import argparse
import json
import os
import sys

from . import device_profiles
from .jobs import TOPOLOGIES
from .model_shapes import MODEL_NAMES, scaled_sizes
from .step_model import (ETHERNET_FRAME_BYTES, LINK_FORMULA, MODES, link_times, mode_shares,
                         payload_share, predict_modes, spread_workers,
                         topology_payload_share)

BYTES_PER_ELEMENT = 4     # float32 weights and gradients, as the store exchanges them


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="odsgd.bench plan", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="resnet50_v1", help="one of " + MODEL_NAMES)
    p.add_argument("--workers", default="16", help="N, or a comma-separated list")
    p.add_argument("--servers", type=int, default=1, help="S")
    p.add_argument("--gbit", default="10", help="Gbit/s of each NIC direction, or a list")
    p.add_argument("--batch-size", type=int, default=128, help="per worker")
    p.add_argument("--device", default=None,
                   help="accelerator of the published step times: "
                        + device_profiles.DEVICE_NAMES)
    p.add_argument("--step-ms", type=float, default=None,
                   help="one worker's forward and backward in ms at --batch-size (wins over "
                        "--step-times and --device)")
    p.add_argument("--step-times", default=None,
                   help="measured step times per model: a JSON file or text, {model: ms at "
                        "--batch-size} or {model: {\"batch_size\": B, \"step_ms\": T}} "
                        "(scaled linearly to --batch-size); wins over --device")
    p.add_argument("--topology", choices=TOPOLOGIES, default="hosts",
                   help="hosts: a NIC per worker and per server; loopback: one shaped queue "
                        "for every process")
    p.add_argument("--mtu", type=int, default=1500,
                   help="the NICs' MTU in bytes (9000 for jumbo frames)")
    p.add_argument("--frame-bytes", type=int, default=ETHERNET_FRAME_BYTES,
                   help="bytes a frame costs beyond its IP packet (default %(default)s: "
                        "Ethernet's header, check, preamble and gap; 14 on the emulated "
                        "hosts, whose shaper counts the header only)")
    p.add_argument("--json", default=None, help="also write the predictions here")
    args = p.parse_args(argv)
    try:
        args.worker_counts = _positive_list(args.workers, int, "--workers")
        args.gbits = _positive_list(args.gbit, float, "--gbit")
        if args.servers < 1 or args.batch_size < 1:
            raise ValueError("--servers and --batch-size must be >= 1")
        if args.mtu < 576 or args.frame_bytes < 0:
            raise ValueError("--mtu must be >= 576 (IPv4's least) and --frame-bytes >= 0, "
                             "got %d and %d" % (args.mtu, args.frame_bytes))
        args.payload_share = payload_share(args.mtu, args.frame_bytes)
        scaled_sizes(args.model)
        args.t_comp, args.t_comp_source = compute_seconds(args)
    except ValueError as refusal:
        p.error(str(refusal))
    return args


def _positive_list(text, kind, option):
    try:
        values = [kind(v) for v in text.split(",") if v.strip()]
    except ValueError:
        values = []
    if not values or min(values) <= 0:
        raise ValueError("%s takes numbers > 0, comma-separated, got %r" % (option, text))
    return values


def compute_seconds(args):
    """(t_comp in seconds, where it comes from): --step-ms, else the model's entry of
    --step-times, else the --device profile."""
    if args.step_ms is not None:
        if args.step_ms <= 0:
            raise ValueError("--step-ms must be > 0, got %g" % args.step_ms)
        return args.step_ms / 1e3, "--step-ms"
    if args.step_times is not None:
        times = load_step_times(args.step_times)
        if args.model in times:
            return measured_step_seconds(times[args.model], args.batch_size), \
                "--step-times (measured)"
        if args.device is None:
            raise ValueError("--step-times has no entry for %r (it has %s); add one, or give "
                             "--device or --step-ms" % (args.model, ", ".join(sorted(times))))
    if args.device is None:
        raise ValueError("the planner needs the computation's time: give --device (%s), "
                         "--step-ms or --step-times" % device_profiles.DEVICE_NAMES)
    device = device_profiles.accelerator(args.device)
    source = ("%s: %s: ResNet-50 at %.0f images/s (batch %d; %s)%s, linear in the batch"
              % (args.device, device.description, device.resnet50_images_per_sec,
                 device.measured_batch, device.source,
                 ", scaled by multiply-adds (an estimate)"
                 if device_profiles.is_estimate(args.model) else ""))
    return device_profiles.step_seconds(args.model, args.device, args.batch_size), source


def load_step_times(text):
    """{model: entry} from a JSON file, or from JSON text (starting with '{')."""
    try:
        if text.lstrip().startswith("{"):
            times = json.loads(text)
        else:
            with open(text) as f:
                times = json.load(f)
    except (OSError, ValueError) as failure:
        raise ValueError("--step-times must be a JSON file or JSON text of {model: ms}: %s"
                         % failure)
    if not isinstance(times, dict):
        raise ValueError("--step-times must hold a JSON object {model: ms}, got %r" % times)
    return times


def measured_step_seconds(entry, batch_size):
    """Seconds per step at `batch_size` from a --step-times entry: ms at that batch size,
    or {"batch_size": B, "step_ms": T}, scaled linearly (T x batch_size / B)."""
    if isinstance(entry, dict):
        try:
            step_ms = float(entry["step_ms"]) * batch_size / float(entry["batch_size"])
        except (KeyError, TypeError, ValueError, ZeroDivisionError):
            raise ValueError("a --step-times entry must be ms, or {\"batch_size\": B, "
                             "\"step_ms\": T} with B > 0, got %r" % (entry,))
    else:
        step_ms = entry
    if isinstance(step_ms, bool) or not isinstance(step_ms, (int, float)) or step_ms <= 0:
        raise ValueError("a --step-times entry must be a time in ms > 0, got %r" % (entry,))
    return step_ms / 1e3


def plan_cluster(parameter_bytes, shares, workers, servers, bandwidth_mbit, batch_size,
                 t_comp, topology="hosts", payload=None):
    """The inputs of the step model for one cluster, with {mode: prediction}
    (step_model.predict_modes) under "modes". `payload`: the share of the rate TCP's payload
    fills (default the emulated topology's, step_model.topology_payload_share)."""
    payload = topology_payload_share(topology) if payload is None else payload
    t_link, push, pull = link_times(topology, workers, servers, parameter_bytes,
                                    bandwidth_mbit, payload)
    return {"topology": topology, "workers": workers, "servers": servers,
            "bandwidth_mbit": bandwidth_mbit, "payload_share": payload,
            "batch_size": batch_size, "parameter_bytes": parameter_bytes, "t_comp": t_comp,
            "t_link": t_link, "push_seconds": push, "pull_seconds": pull, "shares": shares,
            "modes": predict_modes((t_link, push, pull), workers * batch_size, t_comp,
                                   shares, spread_workers=spread_workers(topology, workers))}


def plan_model(model, workers, servers, bandwidth_mbit, batch_size, t_comp, topology="hosts",
               environ=None, payload=None):
    """plan_cluster for `model`'s arrays (model_shapes), with the shares the store's
    settings in `environ` give them (default this process's)."""
    sizes = scaled_sizes(model)
    result = plan_cluster(BYTES_PER_ELEMENT * sum(sizes), mode_shares(sizes, servers, environ),
                          workers, servers, bandwidth_mbit, batch_size, t_comp, topology,
                          payload)
    result.update(model=model, parameter_arrays=len(sizes))
    return result


def print_plan(result):
    r = result
    print("\nN = %d workers, S = %d servers, %g Gbit/s per NIC direction (%s): t_link = %s = "
          "%.1f ms (R: TCP's payload, %.3f of the rate), push %.1f ms, pull %.1f ms; "
          "t_comp %.1f ms"
          % (r["workers"], r["servers"], r["bandwidth_mbit"] / 1e3, r["topology"],
             LINK_FORMULA[r["topology"]], 1e3 * r["t_link"], r["payload_share"],
             1e3 * r["push_seconds"], 1e3 * r["pull_seconds"], 1e3 * r["t_comp"]))
    sync = r["modes"]["dist_sync"]["plan_samples_per_sec"]
    print("%-11s %10s %9s %7s %6s  %-20s %s" % ("mode", "samples/s", "step ms", "x sync",
                                                "s", "binds", "T"))
    for mode in MODES:
        m = r["modes"][mode]
        print("%-11s %10.1f %9.1f %7.2f %6.3f  %-20s %s"
              % (mode, m["plan_samples_per_sec"], 1e3 * m["plan_step_seconds"],
                 m["plan_samples_per_sec"] / sync, m["plan_share"], m["plan_binds"],
                 m["plan_formula"]))


def print_inputs(args):
    """What every plan of this call shares: the model, its bytes, the computation."""
    sizes = scaled_sizes(args.model)
    print("%s: %d arrays, %.1f MB of float32 (M); batch %d per worker; t_comp %.1f ms from %s"
          % (args.model, len(sizes), BYTES_PER_ELEMENT * sum(sizes) / 1e6, args.batch_size,
             1e3 * args.t_comp, args.t_comp_source))
    print("s: the largest server key's share of M (dist_odsgd: its key groups and parts; "
          "MXNet's stores: one key per array, big arrays sliced over the servers)")


def print_local_update(args):
    """The one cost of a GPU worker the model leaves out, where the device is known."""
    elements = sum(scaled_sizes(args.model))
    print("\nnot in the model: the local update on the %s's GPU, about %.2f ms a step "
          "(%d bytes per element at %.0f GB/s)"
          % (args.device, 1e3 * device_profiles.local_update_seconds(elements, args.device),
             device_profiles.LOCAL_UPDATE_BYTES["predict"],
             device_profiles.accelerator(args.device).memory_gb_per_sec))


def main(argv=None):
    args = parse_args(argv)
    print_inputs(args)
    results = []
    for workers in args.worker_counts:
        for gbit in args.gbits:
            result = plan_model(args.model, workers, args.servers, gbit * 1e3,
                                args.batch_size, args.t_comp, args.topology,
                                payload=args.payload_share if args.topology == "hosts"
                                else None)
            print_plan(result)
            results.append(result)
    if args.device is not None:
        print_local_update(args)
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as f:
            json.dump({"command": "python -m odsgd.bench plan " + " ".join(
                sys.argv[2:] if argv is None else list(argv)),
                "t_comp_source": args.t_comp_source, "plans": results}, f, indent=1)
        print("wrote %s" % args.json)
    return 0
