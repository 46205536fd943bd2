"""The default packing of small parameters into server keys (odsgd/common/config.py
DEFAULT_FUSION_ELEMENTS, odsgd/worker/key_plan.py plan_fusion): a ResNet's small arrays make several
keys, never one, so that one key's pull can travel while another key's push does
(docs/design.md, "Why not pack them all into one key")."""
import mxnet as mx
import pytest

from odsgd.common import config
from odsgd.worker.key_plan import plan_fusion


def test_default_is_65536_elements_and_stays_below_the_big_array_bound():
    assert config.DEFAULT_FUSION_ELEMENTS == 65536
    assert config.fusion_elements({}) == 65536
    # MXNet slices keys above its bound over the servers: a fused key must stay below it.
    assert config.fusion_elements({"MXNET_KVSTORE_BIGARRAY_BOUND": "4096"}) == 4095
    assert config.fusion_elements({"ODSGD_FUSION_ELEMENTS": "0"}) == 0
    assert config.fusion_elements({"ODSGD_FUSION_ELEMENTS": "2000000"}) == 999999


def _resnet20_sizes():
    from gluoncv.model_zoo import get_model
    net = get_model("cifar_resnet20_v1", classes=10)
    net.initialize()
    with mx.autograd.record():
        net(mx.nd.zeros((1, 3, 32, 32)))
    return [p.data().size for p in net.collect_params().values() if p.grad_req != "null"]


def test_resnet20_is_spread_over_several_keys():
    sizes = _resnet20_sizes()
    limit = config.fusion_elements({})
    groups = plan_fusion(sizes, ["float32/cpu"] * len(sizes), limit)
    # every array in exactly one key, in the model's order
    assert [p for group in groups for p in group] == list(range(len(sizes)))
    for group in groups:
        total = sum(sizes[p] for p in group)
        assert len(group) == 1 or total <= limit
    # 272,474 elements in packs of at most 65,536: at least ceil(272474 / 65536) = 5 keys
    assert sum(sizes) == 272474
    assert len(groups) >= 5
    # with MXNet's bound as the limit (the old default) it was a single key
    assert len(plan_fusion(sizes, ["float32/cpu"] * len(sizes), 999999)) == 1


@pytest.mark.parametrize("limit", [1, 7, 100])
def test_arrays_at_or_above_the_limit_keep_a_key_of_their_own(limit):
    sizes = [3, 100, 5, 2, 200, 1]
    groups = plan_fusion(sizes, ["k"] * len(sizes), limit)
    for group in groups:
        if any(sizes[p] >= limit for p in group):
            assert len(group) == 1
        else:
            assert sum(sizes[p] for p in group) <= limit
