"""`schedule.server_safe`: GluonCV's LRSequential / LRScheduler objects, as GluonCV's
train_imagenet.py and train_cifar10.py build them, become schedules that the parameter servers
can unpickle (where `import gluoncv` fails) and that give the same rate at every update count.
CPU only, no cluster."""
import copy
import os
import pickle
import subprocess
import sys

import mxnet as mx
import pytest
from gluoncv.utils import LRScheduler, LRSequential

from odsgd.training import schedule

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EPOCHS, ITERS = 20, 50
COUNTS = list(range(0, EPOCHS * ITERS + 6)) + [EPOCHS * ITERS * 2, 10 ** 6]


def recipe(lr_mode, warmup_epochs=5, num_epochs=EPOCHS, iters=ITERS, lr=0.4, warmup_lr=0.0,
           target_lr=0.0, lr_decay=0.1, lr_decay_epoch=(30, 60, 90), power=2):
    """GluonCV's train_imagenet.py schedule, built as that script builds it."""
    decay = [e - warmup_epochs for e in lr_decay_epoch]
    return LRSequential([
        LRScheduler("linear", base_lr=warmup_lr, target_lr=lr, nepochs=warmup_epochs,
                    iters_per_epoch=iters),
        LRScheduler(lr_mode, base_lr=lr, target_lr=target_lr,
                    nepochs=num_epochs - warmup_epochs, iters_per_epoch=iters,
                    step_epoch=decay, step_factor=lr_decay, power=power)])


def cases():
    """(name, GluonCV's scheduler, update counts to compare at)."""
    long_counts = list(range(0, 100 * 10 + 6)) + [5000]
    return [
        ("warmup5+cosine", recipe("cosine"), COUNTS),
        ("warmup5+step", recipe("step", num_epochs=100, iters=10), long_counts),
        ("warmup5+poly2", recipe("poly", target_lr=0.001), COUNTS),
        ("warmup5+linear", recipe("linear"), COUNTS),
        ("warmup5+constant", recipe("constant"), COUNTS),
        ("warmup0+cosine (GluonCV's recipe with an empty warm-up)",
         recipe("cosine", warmup_epochs=0), COUNTS),
        ("cifar10 step, alone", LRScheduler("step", base_lr=0.1, nepochs=EPOCHS,
                                            iters_per_epoch=ITERS, step_epoch=[8, 15],
                                            step_factor=0.2), COUNTS),
        ("step by iteration, alone", LRScheduler("step", base_lr=0.1, niters=600,
                                                 step_iter=[100, 350], step_factor=0.5),
         COUNTS),
        ("cosine, alone", LRScheduler("cosine", base_lr=0.2, target_lr=0.01, nepochs=EPOCHS,
                                      iters_per_epoch=ITERS), COUNTS),
        ("poly3, alone", LRScheduler("poly", base_lr=0.2, nepochs=EPOCHS,
                                     iters_per_epoch=ITERS, power=3), COUNTS),
        ("linear, alone", LRScheduler("linear", base_lr=0.2, target_lr=0.02, nepochs=EPOCHS,
                                      iters_per_epoch=ITERS), COUNTS),
        ("constant, alone", LRScheduler("constant", base_lr=0.05, nepochs=EPOCHS,
                                        iters_per_epoch=ITERS), COUNTS),
        ("cosine, alone, offset 120", LRScheduler("cosine", base_lr=0.2, nepochs=EPOCHS - 3,
                                                  iters_per_epoch=ITERS, offset=120), COUNTS),
        ("step, alone, offset 37", LRScheduler("step", base_lr=0.2, niters=900, offset=37,
                                               step_iter=[100, 500]), COUNTS),
        ("three phases", LRSequential([
            LRScheduler("linear", base_lr=0.001, target_lr=0.1, niters=70),
            LRScheduler("constant", base_lr=0.1, niters=200),
            LRScheduler("poly", base_lr=0.1, target_lr=0.0, niters=730, power=0.9)]), COUNTS),
    ]


CASES = cases()


def values(scheduler, counts):
    return [scheduler(u) for u in counts]


@pytest.mark.parametrize("name,reference,counts", CASES, ids=[c[0] for c in CASES])
def test_same_rate_at_every_count(name, reference, counts):
    expected = values(reference, counts)
    translated = schedule.server_safe(reference)
    assert isinstance(translated, schedule.ServerSafeSchedule)
    assert translated is not reference
    assert values(translated, counts) == expected       # the same floats: GluonCV's code
    assert values(reference, counts) == expected        # the original is left as it was
    assert translated.base_lr == reference.base_lr
    # A translation of the translation is itself, and a pickled copy gives the same rates.
    assert schedule.server_safe(translated) is translated
    assert values(pickle.loads(pickle.dumps(translated)), counts) == expected


def test_rates_after_a_cold_unpickle_without_gluoncv():
    """Pickled translations load and give the same rates in a fresh process where any
    `import gluoncv` fails, as on a parameter server."""
    translated = [schedule.server_safe(reference) for _, reference, _ in CASES]
    optimizer = mx.optimizer.SGD(learning_rate=0.3, momentum=0.9,
                                 lr_scheduler=schedule.server_safe(recipe("cosine")))
    payload = pickle.dumps(([(s, counts) for s, (_, _, counts) in zip(translated, CASES)],
                            optimizer))
    code = (
        "import importlib.abc, pickle, sys\n"
        "class Block(importlib.abc.MetaPathFinder):\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'gluoncv' or name.startswith('gluoncv.'):\n"
        "            raise ImportError('gluoncv is blocked (as on a parameter server)')\n"
        "sys.meta_path.insert(0, Block())\n"
        "sys.modules['gluoncv'] = None\n"
        "try:\n"
        "    import gluoncv\n"
        "    raise SystemExit('gluoncv imported')\n"
        "except ImportError:\n"
        "    pass\n"
        "schedules, opt = pickle.loads(sys.stdin.buffer.read())\n"
        "rates = [[s(u) for u in counts] for s, counts in schedules]\n"
        "opt_rates = []\n"
        "for _ in range(1200):\n"
        "    opt.num_update += 1\n"
        "    opt_rates.append(opt._get_lr(0))\n"
        "assert not any(m.startswith('gluoncv') for m in sys.modules if sys.modules[m]), \\\n"
        "    [m for m in sys.modules if m.startswith('gluoncv')]\n"
        "sys.stdout.buffer.write(pickle.dumps((rates, opt_rates)))\n")
    out = subprocess.run([sys.executable, "-c", code], input=payload, capture_output=True,
                         cwd=REPO, timeout=120, env=dict(os.environ, PYTHONPATH=REPO))
    assert out.returncode == 0, out.stderr.decode()[-3000:]
    rates, opt_rates = pickle.loads(out.stdout)
    for (name, reference, counts), got in zip(CASES, rates):
        assert got == values(reference, counts), name
    assert opt_rates == values(recipe("cosine"), range(1, 1201))


@pytest.mark.parametrize("before", [True, False], ids=["optimizer-then-translate",
                                                       "translate-then-optimizer"])
@pytest.mark.parametrize("mode", ["cosine", "step", "constant"])
def test_optimizer_base_lr_override_alone(mode, before):
    """MXNet's Optimizer sets `lr_scheduler.base_lr = learning_rate`: on a lone GluonCV
    LRScheduler that changes the rates (except in constant mode); the translation follows,
    whether it is made after the optimizer or given to it."""
    def build():
        return LRScheduler(mode, base_lr=0.1, nepochs=EPOCHS, iters_per_epoch=ITERS,
                           step_epoch=[5, 12], offset=20)

    reference = build()
    mx.optimizer.SGD(learning_rate=0.7, lr_scheduler=reference)
    assert reference.base_lr == 0.7
    expected = values(reference, COUNTS)
    if before:
        original = build()
        mx.optimizer.SGD(learning_rate=0.7, lr_scheduler=original)
        translated = schedule.server_safe(original)
    else:
        translated = schedule.server_safe(build())
        mx.optimizer.SGD(learning_rate=0.7, lr_scheduler=translated)
    assert translated.base_lr == 0.7
    assert values(translated, COUNTS) == expected
    assert values(pickle.loads(pickle.dumps(translated)), COUNTS) == expected
    if mode != "constant":
        assert expected != values(build(), COUNTS)     # the override did change the rates
    # A copy given another base rate (as odsgd.common.config does) leaves the first one alone.
    other = copy.copy(translated)
    other.base_lr = 0.01
    reference.base_lr = 0.01
    assert values(other, COUNTS) == values(reference, COUNTS)
    assert values(translated, COUNTS) == expected


def test_optimizer_base_lr_override_sequential():
    """On an LRSequential the Optimizer's base_lr changes no rate; nor on the translation."""
    reference = recipe("cosine")
    expected = values(reference, COUNTS)
    translated = schedule.server_safe(reference)
    mx.optimizer.SGD(learning_rate=0.9, lr_scheduler=reference)
    mx.optimizer.SGD(learning_rate=0.9, lr_scheduler=translated)
    assert reference.base_lr == translated.base_lr == 0.9
    assert values(reference, COUNTS) == values(translated, COUNTS) == expected
    again = pickle.loads(pickle.dumps(translated))
    assert again.base_lr == 0.9 and values(again, COUNTS) == expected


def test_others_returned_as_they_are():
    assert schedule.server_safe(None) is None
    for scheduler in [mx.lr_scheduler.FactorScheduler(step=10, factor=0.5),
                      mx.lr_scheduler.MultiFactorScheduler(step=[10, 20]),
                      mx.lr_scheduler.PolyScheduler(max_update=100, base_lr=0.1),
                      mx.lr_scheduler.CosineScheduler(max_update=100, base_lr=0.1),
                      schedule.build_schedule(0.4, "cosine", 10, 5, warmup_epochs=1)]:
        assert schedule.server_safe(scheduler) is scheduler

    class Own(mx.lr_scheduler.LRScheduler):
        def __call__(self, num_update):
            return 0.1

    own = Own()
    assert schedule.server_safe(own) is own


def test_untranslatable_gluoncv_objects_are_refused():
    from gluoncv.nn.dropblock import DropBlockScheduler

    class Warm(LRScheduler):        # a subclass may compute its own way
        def update(self, num_update):
            self.learning_rate = 0.5

    sub = Warm("cosine", base_lr=0.1, niters=100)
    bad_seq = LRSequential([LRScheduler("linear", base_lr=0.0, target_lr=0.1, niters=10),
                            LRScheduler("cosine", base_lr=0.1, niters=90)])
    bad_seq.schedulers[1].offset = 3                   # changed after LRSequential set it
    bad_mode = LRScheduler("cosine", base_lr=0.1, niters=100)
    bad_mode.mode = "exp"
    for obj in [sub, LRSequential([sub]), bad_seq, bad_mode,
                DropBlockScheduler(None, 0.0, 0.1, 10)]:
        with pytest.raises(ValueError, match="use gluoncv.utils.LRSequential|Use gluoncv"):
            schedule.server_safe(obj)
