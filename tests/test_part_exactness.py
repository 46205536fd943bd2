"""Which global optimizers the store may cut into parts (key_plan.PART_EXACT_OPTIMIZERS),
decided per optimizer MXNet 1.9.1 registers: each is run in the servers' out-of-order harness
of tests/test_server_rounds.py (a fused key, a parameter cut in two, rounds arriving out of
step order) and held to dist_sync, MXNet's own Updater with every parameter its own key.

Those the store cuts must equal dist_sync there. Those it does not cut are run with the layout
the store gives them (parameter 2 on one whole key) and must equal dist_sync then, and the
test shows what cutting would have done to each (the reason it is not cut)."""
import mxnet as mx
import numpy as np
import pytest

from odsgd.worker.key_plan import (PART_EXACT_OPTIMIZERS, SHAPE_READING_OPTIMIZERS,
                                   check_flat_arrays, cuts_arrays)
from test_server_rounds import (ARRIVALS, PACKINGS, SIZES, dist_sync_weights, run_server,
                                server)  # noqa: F401 - the fixture

#: every optimizer MXNet 1.9.1 registers, with settings that use its states and counts
SETTINGS = {
    "sgd": dict(momentum=0.9, wd=0.01),
    "ccsgd": dict(momentum=0.9, wd=0.01),
    "nag": dict(momentum=0.9, wd=0.01),
    "signum": dict(momentum=0.9, wd_lh=0.01),
    "ftml": dict(wd=0.01),
    "dcasgd": dict(momentum=0.0, lamda=0.04),   # MXNet's DCASGD breaks with momentum > 0
    "adam": dict(wd=0.01),
    "adagrad": dict(wd=0.01),
    "rmsprop": dict(centered=True, wd=0.01),
    "adadelta": dict(wd=0.01),
    "ftrl": dict(wd=0.01),
    "adamax": dict(wd=0.01),
    "test": dict(),
    "nadam": dict(wd=0.01),
    "lamb": dict(wd=0.01),
    "lars": dict(momentum=0.9, wd=0.01),
    "lbsgd": dict(momentum=0.9, wd=0.01, warmup_strategy="lars", batch_scale=2),
    "sgld": dict(wd=0.01),
    "groupadagrad": dict(),
}
#: parameter 2 on one whole key (the layout of an optimizer the store does not cut), rounds
#: out of step order as in ARRIVALS
WHOLE = {101: PACKINGS[101], 104: [(2, 0, SIZES[2], -1)]}
WHOLE_ARRIVALS = [(104 if key in (102, 103) else key, step) for key, step in ARRIVALS
                  if key != 103]


def make(name):
    optimizer = mx.optimizer.create(name, learning_rate=0.05, rescale_grad=0.5,
                                    **SETTINGS[name])
    optimizer.set_lr_mult({1: 0.5})
    optimizer.set_wd_mult({0: 0.0})
    return optimizer


def test_every_registered_optimizer_is_decided():
    assert sorted(SETTINGS) == sorted(mx.optimizer.Optimizer.opt_registry)


def _equal(got, expected, indices):
    return all(np.allclose(got[i], expected[i], rtol=1e-6, atol=1e-7) for i in indices)


@pytest.mark.parametrize("name", PART_EXACT_OPTIMIZERS)
def test_optimizers_the_store_cuts_equal_dist_sync_on_parts(server, name):
    assert cuts_arrays(make(name))
    expected = dist_sync_weights(make(name))
    got = run_server(server, make(name))
    for index in SIZES:
        np.testing.assert_allclose(got[index], expected[index], rtol=1e-6, atol=1e-7,
                                   err_msg="%s, parameter %d" % (name, index))


@pytest.mark.parametrize("name", ["lamb", "lars", "lbsgd"])
def test_norm_reading_optimizers_travel_whole_and_equal_dist_sync(server, name):
    """Their update reads the norms of the whole array: cut, parameter 2 would differ."""
    assert not cuts_arrays(make(name))
    expected = dist_sync_weights(make(name))
    whole = run_server(server, make(name), WHOLE, WHOLE_ARRIVALS)
    for index in SIZES:
        np.testing.assert_allclose(whole[index], expected[index], rtol=1e-6, atol=1e-7,
                                   err_msg="%s, parameter %d" % (name, index))
    server._SPLIT_COUNTS.clear()
    cut = run_server(server, make(name))
    assert not _equal(cut, expected, [2])


def test_nadam_travels_whole_and_equals_dist_sync_on_one_parameter(server):
    """Nadam advances one schedule shared by every array at each update call: a parameter in
    two parts would advance it twice per round. (With several parameters it depends on the
    order of the calls, in dist_sync too, so the check holds one parameter.)"""
    assert not cuts_arrays(make("nadam"))
    one = [(k, s) for k, s in WHOLE_ARRIVALS if k == 104]
    expected = dist_sync_weights(make("nadam"), indices=(2,))
    whole = run_server(server, make("nadam"), {104: WHOLE[104]}, one)
    np.testing.assert_allclose(whole[2], expected[2], rtol=1e-6, atol=1e-7)
    server._SPLIT_COUNTS.clear()
    parts = {key: PACKINGS[key] for key in (102, 103)}
    cut = run_server(server, make("nadam"), parts,
                     [(k, s) for k, s in ARRIVALS if k in parts])
    assert not _equal(cut, expected, [2])


def test_sgld_travels_whole():
    """SGLD draws its noise at each update call: parts would draw other numbers than the
    whole array (no run of it repeats, dist_sync's neither, so there is nothing to compare)."""
    assert not cuts_arrays(make("sgld"))


def test_shape_reading_optimizers_are_refused():
    for name in SHAPE_READING_OPTIMIZERS:
        with pytest.raises(ValueError, match="reads the rows of 2-D arrays.*dist_sync"):
            check_flat_arrays(make(name))


def test_an_unregistered_subclass_travels_whole():
    """The store cannot know what an optimizer of the user's own does with a part."""
    class MySGD(mx.optimizer.SGD):
        pass
    assert not cuts_arrays(MySGD(learning_rate=0.1))
