"""The planner (`odsgd.bench plan`), its step model, the accelerator-paced worker and the byte
scale of the throughput benchmark: closed forms, the predictions recorded in results/, the
shapes table against the real GluonCV models, and one short paced job."""
import glob
import json
import os
import statistics
import tempfile
import time

import pytest

from odsgd.bench import device_profiles, model_shapes, paced, plan, step_model, throughput

pytestmark = pytest.mark.timeout(60)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
M = 10 ** 6              # bytes of parameters, for the closed forms below
B_MBIT = 1000            # R = 125e6 bytes/s: M takes 8 ms on one queue


def _elements(shape):
    count = 1
    for dim in shape:
        count *= dim
    return count


# -- the shapes table and the device profiles --------------------------------------------------

@pytest.mark.timeout(180)
def test_shapes_table_is_the_gluoncv_models():
    """Every trained array of the real models, in gluon.Trainer's order (sorted by name), has
    the table's shape; and the models' multiply-adds per image (convolutions and dense layers
    at 224x224, CIFAR's at 32x32) are device_profiles.MULTIPLY_ADDS."""
    import mxnet as mx
    from gluoncv.model_zoo import get_model
    sizes = {"resnet50_v1": (1000, 224), "resnet18_v2": (1000, 224),
             "cifar_resnet20_v1": (10, 32)}
    assert set(sizes) == set(model_shapes.SHAPES) == set(device_profiles.MULTIPLY_ADDS)
    for name, (classes, image) in sizes.items():
        net = get_model(name, classes=classes)
        net.initialize()
        counted = [0]

        def count(block, _inputs, output):
            weight = block.weight.data()
            counted[0] += output.size // output.shape[0] * (weight.size // weight.shape[0])

        _hook_layers(net, count, (mx.gluon.nn.Conv2D, mx.gluon.nn.Dense))
        with mx.autograd.record():
            net(mx.nd.zeros((1, 3, image, image)))
        params = net.collect_params()
        trainer = mx.gluon.Trainer(params, "sgd")
        shapes = [tuple(p.shape) for p in trainer._params if p.grad_req != "null"]
        assert shapes == list(model_shapes.SHAPES[name]), name
        assert counted[0] == device_profiles.MULTIPLY_ADDS[name], name


def _hook_layers(block, hook, kinds):
    if isinstance(block, kinds):
        block.register_forward_hook(hook)
    for child in block._children.values():
        _hook_layers(child, hook, kinds)


def test_device_step_times_from_the_published_figures():
    """V100 FP32: 384 images/s of ResNet-50 at batch 96, so 250 ms a step there and linear
    in the batch; the other models by multiply-adds; the local update moves 20 bytes per
    element at 900 GB/s."""
    assert device_profiles.step_seconds("resnet50_v1", "v100", 96) == pytest.approx(0.25)
    assert device_profiles.step_seconds("resnet50_v1", "v100", 192) == pytest.approx(0.5)
    assert device_profiles.step_seconds("resnet50_v1", "a100-amp", 256) == \
        pytest.approx(256 / 2180.0)
    ratio = 40813184 / 3857973248.0
    assert device_profiles.step_seconds("cifar_resnet20_v1", "v100", 128) == \
        pytest.approx(128 * ratio / 384.0)
    assert not device_profiles.is_estimate("resnet50_v1")
    assert device_profiles.is_estimate("resnet18_v2")
    elements = sum(model_shapes.scaled_sizes("resnet50_v1"))
    assert device_profiles.local_update_seconds(elements, "v100") == \
        pytest.approx(elements * 20 / 900e9)
    with pytest.raises(ValueError, match="unknown device profile 'h100'.*v100"):
        device_profiles.step_seconds("resnet50_v1", "h100", 96)
    with pytest.raises(ValueError, match="no step time for model 'mlp'"):
        device_profiles.step_seconds("mlp", "v100", 96)
    with pytest.raises(ValueError, match="batch size must be >= 1"):
        device_profiles.step_seconds("resnet50_v1", "v100", 0)


# -- the byte scale ----------------------------------------------------------------------------

def test_byte_scale_divides_every_array_and_keeps_their_count():
    full = model_shapes.scaled_sizes("resnet50_v1")
    scaled = model_shapes.scaled_sizes("resnet50_v1", 64)
    assert len(scaled) == len(full) == 193
    assert scaled == [max(1, n // 64) for n in full]
    assert min(model_shapes.scaled_sizes("cifar_resnet20_v1", 10 ** 6)) == 1
    assert model_shapes.scaled_shapes("cifar_resnet20_v1", 1)[2] == (16, 3, 3, 3)
    assert model_shapes.scaled_shapes("cifar_resnet20_v1", 4)[2] == (108,)
    for bad in (0, -2, 1.5):
        with pytest.raises(ValueError, match="byte scale must be an integer >= 1"):
            model_shapes.scaled_sizes("resnet50_v1", bad)
    with pytest.raises(ValueError, match="no parameter shapes for model 'mlp'.*resnet50_v1"):
        model_shapes.scaled_sizes("mlp")


def test_byte_scale_keeps_the_link_time_and_the_key_plan():
    """Bytes and link rate divided by K: t_link, push and pull stay the cluster's (to the
    rounding of the arrays); the store's size settings are divided too, so dist_odsgd's
    largest key keeps its share."""
    full = model_shapes.scaled_sizes("resnet50_v1")
    scaled = model_shapes.scaled_sizes("resnet50_v1", 64)
    cluster = step_model.link_times("hosts", 12, 1, 4 * sum(full), 10000)
    emulated = step_model.link_times("hosts", 12, 1, 4 * sum(scaled), 10000 / 64.0)
    for a, b in zip(cluster, emulated):
        assert b == pytest.approx(a, rel=0.01)
    environ = paced.scaled_store_environment(64, {})
    assert environ == {"MXNET_KVSTORE_BIGARRAY_BOUND": "15625",
                       "ODSGD_FUSION_ELEMENTS": "1024", "ODSGD_PART_ELEMENTS": "4096"}
    assert paced.scaled_store_environment(1, {}) == {}
    assert paced.scaled_store_environment(8, {"ODSGD_FUSION_ELEMENTS": "0"})[
        "ODSGD_FUSION_ELEMENTS"] == "0"                         # off stays off
    assert step_model.mode_shares(scaled, 1, environ)["dist_odsgd"] == pytest.approx(
        step_model.mode_shares(full, 1, {})["dist_odsgd"], rel=0.02)


# -- the step model and the planner ------------------------------------------------------------

@pytest.mark.parametrize("topology,sync_ms,async_ms,odsgd_ms,binds", [
    # hosts, N=2, S=1: t_link = push = pull = 16 ms; t_comp 30 ms, s 0.5 (MXNet), 0.25 (odsgd)
    # sync 30 + max(16 + 8, 16) = 54; async 30 + 16 = 46; odsgd max(30, 16, (16+4+30)/2) = 30
    ("hosts", 54.0, 46.0, 30.0, "compute"),
    # loopback: t_link 32 ms, push = pull = 16 ms: sync 30 + max(24, 32) = 62; async 62;
    # odsgd max(30, 32, 25) = 32, the link
    ("loopback", 62.0, 62.0, 32.0, "link"),
])
def test_planner_closed_forms(topology, sync_ms, async_ms, odsgd_ms, binds):
    shares = {"dist_sync": 0.5, "dist_async": 0.5, "dist_odsgd": 0.25}
    # the formulas at the whole rate (test_payload_share: the share TCP's headers leave)
    result = plan.plan_cluster(M, shares, 2, 1, B_MBIT, 100, 0.030, topology, payload=1.0)
    modes = result["modes"]
    for mode, ms in (("dist_sync", sync_ms), ("dist_async", async_ms),
                     ("dist_odsgd", odsgd_ms)):
        assert modes[mode]["plan_step_seconds"] == pytest.approx(ms / 1e3), mode
        assert modes[mode]["plan_samples_per_sec"] == pytest.approx(200 / (ms / 1e3)), mode
    assert modes["dist_odsgd"]["plan_binds"] == binds
    # the chain binds when push + s * pull + t_comp > 2 max(t_comp, t_link)
    step, what = step_model.mode_step("dist_odsgd", 0.030, 0.016, 0.016, 0.016, 1.0)
    assert (step, what) == (pytest.approx(0.031), "chain")
    # MXNet's stores: one key per array, arrays of the big-array bound or more sliced
    assert step_model.sync_key_share([100, 300], 2, 200) == pytest.approx(150 / 400.0)
    assert step_model.sync_key_share([100, 300], 2, 1000) == pytest.approx(300 / 400.0)
    # the CPU, where measured, bounds MXNet's modes as a term of its own
    assert step_model.mode_step("dist_sync", 0.03, 0.016, 0.016, 0.016, 0.5, 0.1) == \
        (0.1, "cpu")


def test_payload_share():
    """TCP's payload share of a link's rate, MSS / (MTU + frame bytes), MSS = MTU - 52: worked
    by hand for the emulated hosts (tc counts the 14 bytes of Ethernet's header), a real
    Ethernet wire (38) and jumbo frames; the emulated hosts' share is what `odsgd.bench
    goodput` measured through a shaped NIC (results/goodput.json); the model's link times
    take the whole rate times the share."""
    assert step_model.payload_share() == pytest.approx(1448 / 1514.0)
    assert step_model.payload_share(frame_bytes=step_model.ETHERNET_FRAME_BYTES) == \
        pytest.approx(1448 / 1538.0)
    assert step_model.payload_share(9000, 38) == pytest.approx(8948 / 9038.0)
    assert step_model.payload_share(1500, 14, mss=1460) == pytest.approx(1460 / 1514.0)
    assert step_model.topology_payload_share("loopback") == 1.0
    with open(os.path.join(REPO, "results", "goodput.json")) as f:
        measured = [row["share"] for row in json.load(f)["rows"]]
    assert len(measured) == 6
    for share in measured:
        assert share == pytest.approx(step_model.topology_payload_share("hosts"), abs=0.005)
    whole = step_model.link_times("hosts", 2, 1, M, B_MBIT, payload=1.0)
    assert whole == (pytest.approx(0.016),) * 3                  # 2 M / R at the whole rate
    assert step_model.link_times("hosts", 2, 1, M, B_MBIT) == \
        tuple(pytest.approx(t * 1514 / 1448.0) for t in whole)
    assert step_model.link_times("loopback", 2, 1, M, B_MBIT) == \
        (pytest.approx(0.032), pytest.approx(0.016), pytest.approx(0.016))


def test_replan_recomputes_only_the_predictions(tmp_path, capsys):
    """`odsgd.bench replan`: a recorded run whose predictions are stale (made so here) gets
    today's model's back, every other field as recorded; --check finds the stale run, and
    passes on every results JSON of the repository (their predictions are today's)."""
    from odsgd.bench import replan
    source = os.path.join(REPO, "results", "paper_cluster_rn50_8w1s.json")
    with open(source) as f:
        document = json.load(f)
    stale = json.loads(json.dumps(document))
    stale["runs"][0]["plan_samples_per_sec"] *= 1.5
    stale["runs"][2]["predicted_samples_per_sec"] *= 0.5
    path = tmp_path / "stale.json"
    path.write_text(json.dumps(stale, indent=1))
    assert replan.main(["--check", str(path)]) == 1
    assert json.loads(path.read_text()) == stale                # --check writes nothing
    assert replan.main([str(path)]) == 0
    assert json.loads(path.read_text()) == document
    assert replan.main(["--check", str(path)]) == 0
    # a stale field other than the rate (what binds, the step's parts) is found as well
    for field, value in (("plan_binds", "x"), ("plan_step_seconds", -1.0)):
        other = json.loads(json.dumps(document))
        other["runs"][0][field] = value
        path.write_text(json.dumps(other, indent=1))
        assert replan.main(["--check", str(path)]) == 1, field
    recorded = [p for p in glob.glob(os.path.join(REPO, "results", "**", "*.json"),
                                     recursive=True)
                if '"plan_samples_per_sec"' in open(p).read()
                or '"predicted_samples_per_sec"' in open(p).read()]
    assert len(recorded) >= 20
    capsys.readouterr()
    assert replan.main(["--check"] + sorted(recorded)) == 0, capsys.readouterr().out


def _recorded(pattern):
    for path in sorted(glob.glob(os.path.join(REPO, "results", pattern))):
        with open(path) as f:
            for run in json.load(f)["runs"]:
                yield os.path.basename(path), run


def test_async_spread_workers_closed_forms():
    """dist_async's spread-out picture, the closed network's exact mean-value analysis worked
    by hand: one worker alternates t_comp with its push and its pull, each the whole t_link
    (T = t_comp + 2 t_link); two, with D = t_link / 2 per visit, find the other's request in
    a queue Q(1) = D / (t_comp + 2 D) of the time (T = t_comp + 2 D (1 + Q(1))); many keep the
    NIC busy, T -> t_link. The model takes the shorter of it and t_comp + t_link."""
    spread = step_model.spread_async_step_seconds
    assert spread(0.3, 0.4, 1) == pytest.approx(0.3 + 0.8)
    assert spread(0.3, 0.4, 2) == pytest.approx(0.3 + 0.4 * (1 + 0.2 / 0.7))
    assert spread(0.3, 0.4, 400) == pytest.approx(0.4, rel=0.01)
    assert step_model.async_step_seconds(0.3, 0.4, 2) == pytest.approx(0.7)     # in phase
    assert step_model.async_step_seconds(0.3, 0.4, 400) == pytest.approx(0.4, rel=0.01)
    assert step_model.async_step_seconds(0.3, 0.4) == pytest.approx(0.7)        # no N given
    assert step_model.async_step_seconds(0.3, 0.0, 8) == pytest.approx(0.3)     # unshaped
    # the planner spreads them on hosts only (one loopback queue carries both directions)
    assert step_model.spread_workers("hosts", 8) == 8
    assert step_model.spread_workers("loopback", 8) is None
    # what binds says which picture set the step: 400 spread-out workers keep the link busy
    assert step_model.mode_step("dist_async", 0.3, 0.4, 0.4, 0.4, workers=400)[1] == \
        "link (spread out)"
    assert step_model.mode_step("dist_async", 0.3, 0.4, 0.4, 0.4, workers=2) == \
        (pytest.approx(0.7), "link (in series)")


def test_planner_reproduces_the_recorded_predictions():
    """Every dist_odsgd entry of results/throughput_hosts_exchange26_*.json with a
    predicted rate: the planner, given the same t_comp (the model's, CPU included), link and
    share, predicts the same samples/s."""
    checked = 0
    for name, r in _recorded("throughput_hosts_exchange26_*.json"):
        if r["mode"] != "dist_odsgd" or not r.get("predicted_samples_per_sec"):
            continue
        share = r.get("predicted_last_share") or 1.0
        result = plan.plan_cluster(r["parameter_bytes"], {"dist_odsgd": share}, r["workers"],
                                   r["servers"], r["bandwidth_mbit"], r["batch_size"],
                                   r["predicted_t_comp"], r["topology"])
        assert result["modes"]["dist_odsgd"]["plan_samples_per_sec"] == pytest.approx(
            r["predicted_samples_per_sec"], rel=1e-9), (name, r["bandwidth_mbit"])
        # the bound's t_link counts the payload at the whole rate, the model's at its share
        assert result["t_link"] * result["payload_share"] == pytest.approx(r["wire_seconds"],
                                                                           rel=1e-9)
        checked += 1
    assert checked == 9


def _sizes_of(run):
    if run["model"] == "mlp":
        h = run["mlp_hidden"]
        return [1024 * h, h, h * h, h, h * 10, 10]
    return model_shapes.scaled_sizes(run["model"])


def test_sync_and_async_models_fit_the_measured_hosts_tables():
    """measured / predicted samples/s of dist_sync and dist_async in every shaped run of
    results/throughput_hosts*.json (2 and 4 workers), the model taking each run's t_comp,
    CPU seconds per step over the cores and shares: the medians docs/benchmarks.md
    reports, and no run off by more than the range given there."""
    ratios = {"dist_sync": [], "dist_async": []}
    for _, r in _recorded("throughput_hosts*.json"):
        if r["mode"] not in ratios or not r.get("wire_seconds"):
            continue
        link = step_model.link_times(r["topology"], r["workers"], r["servers"],
                                     r["parameter_bytes"], r["bandwidth_mbit"])
        cpu = (r.get("cpu_seconds_per_step") or 0.0) / r["cores"]
        shares = step_model.mode_shares(_sizes_of(r), r["servers"], {})
        predicted = step_model.predict_modes(
            link, r["workers"] * r["batch_size"], r["t_comp"], shares, cpu, [r["mode"]],
            step_model.spread_workers(r["topology"], r["workers"]))[r["mode"]]
        ratios[r["mode"]].append(r["samples_per_sec"] / predicted["plan_samples_per_sec"])
    # dist_async: 15 runs of the older tables, 7 of the 2-worker table of record.
    # The link's payload share (step_model.payload_share) moved the medians from 1.04 and 0.99
    # to 1.07 and 1.02, and dist_sync's largest from 1.18 to 1.20: the ceiling 1.2 became
    # 1.25 then, with the term, not the runs, changed; the record measured again under CUBIC
    # moved dist_async's median to 1.05 (docs/benchmarks.md)
    assert len(ratios["dist_sync"]) == 6 and len(ratios["dist_async"]) == 22
    assert statistics.median(ratios["dist_sync"]) == pytest.approx(1.07, abs=0.01)
    assert statistics.median(ratios["dist_async"]) == pytest.approx(1.05, abs=0.01)
    assert 0.9 < min(ratios["dist_sync"]) and max(ratios["dist_sync"]) < 1.25
    assert 0.7 < min(ratios["dist_async"]) and max(ratios["dist_async"]) < 1.25


def test_paper_cluster_table_against_the_planner():
    """The 27 rows of results/paper_cluster_*.json (docs/benchmarks.md, "The paper's cluster
    on this machine: measured"): the step model today, fed each row's recorded inputs,
    gives the recorded predictions, and is within 10% of the measured rate on the 6 rows the
    docs name."""
    from odsgd.bench import throughput
    within = []
    rows = 0
    for name, r in _recorded("paper_cluster_*.json"):
        sizes = model_shapes.scaled_sizes(r["model"], r["byte_scale"])
        environ = paced.scaled_store_environment(r["byte_scale"], {})
        now = throughput.plan_fields(r, r["workers"] * r["batch_size"], r["shaped_mbit"],
                                     sizes, environ)
        assert now["plan_samples_per_sec"] == pytest.approx(r["plan_samples_per_sec"],
                                                            rel=1e-9), (name, r["mode"])
        ratio = r["samples_per_sec"] / now["plan_samples_per_sec"]
        if 0.9 <= ratio <= 1.1:
            within.append((name, r["mode"], r["bandwidth_mbit"]))
        rows += 1
    assert rows == 27
    assert sorted(within) == sorted([
        ("paper_cluster_rn50_8w4s.json", "dist_odsgd", 10000),
        ("paper_cluster_rn50_8w4s.json", "dist_odsgd", 25000),
        ("paper_cluster_rn50_12w4s.json", "dist_odsgd", 25000),
        ("paper_cluster_resnet20_8w1s.json", "dist_odsgd", 1000),
        ("paper_cluster_rn50_12w1s.json", "dist_odsgd", 10000),
        ("paper_cluster_rn50_8w1s.json", "dist_odsgd", 10000)])


def test_planner_command(capsys):
    """16 V100s at batch 128 (333.3 ms), 4 servers, 25 Gbit/s: t_link = 16 M / (4 R) =
    130.9 ms at the whole rate, 139.1 ms at the payload share of a real Ethernet wire (1448 /
    1538; 136.9 at the emulated hosts' 1448 / 1514) < t_comp, so dist_odsgd is compute-bound
    at 16 x 128 / 0.3333 = 6144 samples/s."""
    with tempfile.TemporaryDirectory() as folder:
        out = os.path.join(folder, "plan.json")
        assert plan.main(["--model", "resnet50_v1", "--workers", "16", "--servers", "4",
                          "--gbit", "25", "--device", "v100", "--json", out]) == 0
        with open(out) as f:
            saved = json.load(f)["plans"]
    text = capsys.readouterr().out
    row = next(line for line in text.splitlines() if line.startswith("dist_odsgd"))
    assert "6144.0" in row and "compute" in row
    assert "t_link = max(M/R, N*M/(S*R)) = 139.1 ms (R: TCP's payload, 0.941 of the rate)" \
        in text
    assert "DeepLearningExamples" in text and "0.57 ms" in text      # source, local update
    (result,) = saved
    assert result["t_comp"] == pytest.approx(128 / 384.0)
    assert result["parameter_bytes"] == 4 * 25575912
    assert result["payload_share"] == pytest.approx(1448 / 1538.0)
    plan.main(["--model", "resnet50_v1", "--workers", "16", "--servers", "4", "--gbit", "25",
               "--device", "v100", "--frame-bytes", "14"])
    assert "= 136.9 ms (R: TCP's payload, 0.956 of the rate)" in capsys.readouterr().out
    # a measured time per model, scaled linearly to the batch size
    plan.main(["--model", "cifar_resnet20_v1", "--workers", "2", "--gbit", "1", "--step-times",
               '{"cifar_resnet20_v1": {"batch_size": 64, "step_ms": 10}}'])
    assert "t_comp 20.0 ms" in capsys.readouterr().out


@pytest.mark.parametrize("argv,message", [
    (["--model", "mlp", "--device", "v100"], "no parameter shapes for model 'mlp'"),
    (["--device", "h100"], "unknown device profile 'h100'"),
    ([], "needs the computation's time: give --device"),
    (["--device", "v100", "--gbit", "0"], "--gbit takes numbers > 0"),
    (["--device", "v100", "--workers", "two"], "--workers takes numbers > 0"),
    (["--step-ms", "-5"], "--step-ms must be > 0"),
    (["--device", "v100", "--mtu", "100"], "--mtu must be >= 576"),
    (["--step-times", "{not json"], "--step-times must be a JSON file or JSON text"),
    (["--step-times", '{"resnet18_v2": 5}'], "--step-times has no entry for 'resnet50_v1'"),
    (["--step-times", '{"resnet50_v1": {"step_ms": 5}}'], "must be ms, or"),
])
def test_planner_refuses_bad_input(capsys, argv, message):
    with pytest.raises(SystemExit):
        plan.parse_args(argv)
    assert message in capsys.readouterr().err


# -- the paced worker in the throughput benchmark ----------------------------------------------

def test_throughput_options_of_paced_workers(capsys):
    args = throughput.parse_args(["--model", "resnet50_v1", "--device-profile", "v100",
                                  "--batch-size", "96", "--byte-scale", "64"])
    assert args.paced and args.compute_ms == pytest.approx(250.0)
    assert throughput.shaped_mbit(args, 10000) == pytest.approx(156.25)
    job = [str(a) for a in throughput._job_args(args, "out")]
    assert job[job.index("--compute-ms") + 1] == "250.0"
    assert job[job.index("--byte-scale") + 1] == "64"
    assert throughput._env(args)["ODSGD_PART_ELEMENTS"] == "4096"
    assert throughput.parse_args(["--model", "resnet50_v1", "--compute-ms", "5",
                                  "--device-profile", "v100"]).compute_ms == 5.0
    for argv, message in [(["--byte-scale", "8"], "--byte-scale scales the arrays"),
                          (["--compute-ms", "10"], "no parameter shapes for model 'mlp'"),
                          (["--model", "resnet50_v1", "--device-profile", "p100"],
                           "unknown device profile 'p100'"),
                          (["--model", "resnet50_v1", "--compute-ms", "-1"],
                           "--compute-ms must be >= 0")]:
        with pytest.raises(SystemExit):
            throughput.parse_args(argv)
        assert message in capsys.readouterr().err


def test_paced_entries_carry_every_modes_prediction(capsys):
    """A made-up paced run on hosts (no jobs): N=2, S=1, batch 100, byte scale 4 at a nominal
    4000 Mbit/s (NICs at 1000), M = 1 MB scaled, t_comp 30 ms: t_link = push = pull = 16 ms;
    dist_async 30 + 16 = 46 ms at the whole rate, 30 + 16.73 at TCP's payload share (1448 /
    1514); each mode's rate and what binds, the paced fields."""
    import argparse
    args = argparse.Namespace(workers=2, servers=1, batch_size=100, topology="hosts",
                              model="cifar_resnet20_v1", mlp_hidden=8, dense_layers=1,
                              dense_width=1, image_size=32, cores=2, paced=True,
                              compute_ms=30.0, device_profile=None, byte_scale=4)
    compute = {"t_comp": 0.03, "parameter_arrays": 2, "parameter_bytes": M}
    rates = {mode: [2000.0] for mode in step_model.MODES}
    cores = {mode: [{"worker": 0.1}] for mode in step_model.MODES}
    runs = throughput._summarise(args, 4 * B_MBIT, rates, compute, 0.02, [], cores)
    by_mode = {r["mode"]: r for r in runs}
    step = 0.03 + 0.016 * 1514 / 1448.0
    assert by_mode["dist_async"]["plan_step_seconds"] == pytest.approx(step)
    assert by_mode["dist_async"]["plan_samples_per_sec"] == pytest.approx(200 / step)
    assert by_mode["dist_odsgd"]["plan_samples_per_sec"] == \
        pytest.approx(by_mode["dist_odsgd"]["predicted_samples_per_sec"])
    for r in runs:
        assert (r["bandwidth_mbit"], r["shaped_mbit"], r["byte_scale"]) == (4000, 1000, 4)
        assert r["wire_seconds"] == pytest.approx(0.016)
    throughput.print_table(runs)
    table = capsys.readouterr().out
    row = next(line for line in table.splitlines() if "dist_async" in line and "Mbit/s" in line)
    assert "%.1f" % (200 / step) in row and row.split()[-1] == "%.2f" % (2000 * step / 200)
    assert "T = min(t_comp + t_link, MVA of N workers on the busiest NIC) = 46.7 ms" in table
    assert "byte scale 4: arrays and link / 4 (NICs shaped to 1000 Mbit/s)" in table


def test_paced_worker_trains_the_tables_arrays():
    """The paced worker's parameters: the table's shapes in the Trainer's order, gradients
    written once and marked fresh; a step without a Trainer waits its compute time."""
    import mxnet as mx
    params = paced.paced_parameters("cifar_resnet20_v1", 1)
    trainer = mx.gluon.Trainer(params, "sgd", {"learning_rate": 0.1})
    assert [tuple(p.shape) for p in trainer._params] == \
        list(model_shapes.SHAPES["cifar_resnet20_v1"])
    first = params["p000"].grad().asnumpy()
    assert first.std() > 0 and params["p000"].data()._fresh_grad
    step = paced.paced_step(params, 0.05)
    tic = time.perf_counter()
    for _ in range(3):
        step()
    # The lower bound is the point: each step waits its compute time. The upper bound only
    # catches a gross extra wait; it is loose because this shared 2-core machine measured
    # 0.52 s for these 0.15 s while a study ran beside the tests.
    assert 0.15 <= time.perf_counter() - tic < 1.5
    # one record per step; with no Trainer nothing is issued and the whole compute time is
    # slept (time.sleep sleeps at least its argument)
    assert len(step.phases) == 3
    means = paced.phase_means(step.phases)
    assert set(means) == set(paced.PHASES)
    assert means["compute"] >= 0.05 and means["issue"] == 0.0 and means["wait_weights"] >= 0
    assert means["compute"] == pytest.approx(sum(p[1] for p in step.phases) / 3)
    # settle() waits for the weights as a step's start does, and that wait is the next
    # step's: an engine operation still writing a weight (a chain of 1500x1500 products)
    weight = params["p000"].data()
    x = mx.nd.random.uniform(shape=(1500, 1500))
    for _ in range(4):
        x = mx.nd.dot(x, x) * 1e-3
    (x.sum() * 0).broadcast_to(weight.shape).copyto(weight)
    tic = time.perf_counter()
    step.settle()
    settled = time.perf_counter() - tic
    step()
    assert settled > 0 and step.phases[-1][0] >= settled
    assert params["p000"].data().asnumpy().max() == 0      # the write did land first
    line = paced.phases_line(dict(means, wait_weights_max=0.25))
    assert "%.1f ms computing" % (1e3 * means["compute"]) in line
    assert "(longest worker 250.0)" in line


def test_paced_steps_issue_time_comes_out_of_the_compute_wait():
    """A step's wait is compute_seconds less the last Trainer.step call (on an accelerator
    the exchange is issued during the backward): with a trainer whose step takes 20 ms, each
    step after the first sleeps compute_seconds - issue, and its records say so."""
    class Issuing:
        def step(self, batch_size):
            time.sleep(0.02)

    params = paced.paced_parameters("cifar_resnet20_v1", 1)
    step = paced.paced_step(params, 0.05, Issuing(), batch_size=4)
    for _ in range(4):
        step()
    assert len(step.phases) == 4 and all(p[0] >= 0 for p in step.phases)
    issues = [p[2] for p in step.phases]
    computes = [p[1] for p in step.phases]
    assert all(i >= 0.02 for i in issues)
    assert computes[0] >= 0.05                      # nothing issued before the first step
    for previous_issue, compute in zip(issues[:-1], computes[1:]):
        assert compute >= 0.05 - previous_issue
        assert compute + previous_issue < 0.05 + 0.2   # loose: a shared 2-core machine


@pytest.mark.timeout(150)
def test_paced_job_runs_at_the_predicted_rate_when_compute_bound(tmp_path):
    """2 paced workers (cifar_resnet20_v1's arrays, 100 ms a step) and a server on the
    unshaped loopback, dist_odsgd: the step model predicts the compute bound, N B / t_comp.
    The exchange of 1.1 MB in a few fused keys takes a few ms beside 100 ms of waiting and is
    hidden behind it; what is not hidden is the worker's own Python between waits and the
    scheduling of 3 processes on this shared 2-core machine, hence 25% either way (measured
    0.96 of it on the loaded machine)."""
    from odsgd.bench.jobs import run_job
    job = ["odsgd.bench.throughput_job", "--model", "cifar_resnet20_v1", "--compute-ms", 100,
           "--batch-size", 16, "--steps", 12, "--skip", 4, "--kvstore", "dist_odsgd",
           "--out", tmp_path]
    run_job(job, workers=2, servers=1, timeout=120, stall_timeout=60,
            env={"OMP_NUM_THREADS": "1", "ODSGD_WARMUP_STEPS": "1"})
    measured = 0.0
    for rank in range(2):
        with open(os.path.join(tmp_path, "rank%d.json" % rank)) as f:
            measured += json.load(f)["samples_per_sec"]
    predicted = step_model.predict_modes((0.0, 0.0, 0.0), 2 * 16, 0.1, {})["dist_odsgd"]
    assert predicted["plan_binds"] == "compute"
    assert 0.75 <= measured / predicted["plan_samples_per_sec"] <= 1.25, measured


def test_prediction_plot_groups_runs_by_configuration(tmp_path):
    """One group per run and bandwidth, one bar per mode, the predicted rate beside it."""
    from odsgd.bench import prediction_plot
    runs = []
    for bandwidth in (10000, 25000):
        for mode in step_model.MODES:
            runs.append({"mode": mode, "model": "resnet50_v1", "workers": 8, "servers": 1,
                         "bandwidth_mbit": bandwidth, "samples_per_sec": 1000.0,
                         "samples_per_sec_min": 900.0, "samples_per_sec_max": 1100.0,
                         "plan_samples_per_sec": 1200.0})
    path = tmp_path / "runs.json"
    path.write_text(json.dumps({"runs": runs}))
    groups = prediction_plot.grouped(prediction_plot.load_runs([str(path)]))
    assert [label for label, _ in groups] == ["resnet50_v1\n8w+1s, 10 Gbit/s",
                                              "resnet50_v1\n8w+1s, 25 Gbit/s"]
    assert all(set(modes) == set(step_model.MODES) for _, modes in groups)
    out = tmp_path / "plot.png"
    assert prediction_plot.main([str(path), "--out", str(out)]) == 0
    assert out.stat().st_size > 1000
