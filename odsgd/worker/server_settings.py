"""`ServerSettings`: what the servers must know before a step's rounds and that MXNet's dist
store never tells them: the packings of new key groups, a learning rate set on the worker and
Gluon's per-parameter multipliers. Each goes through the command channel of
odsgd/server/updater.py, once, when it is new or changed."""
import logging

import mxnet as mx

from ..server import updater as servers

LOG = logging.getLogger("odsgd")


class ServerSettings(object):
    """The settings the servers of `raw` (MXNet's dist store) hold, as this worker sent them."""

    def __init__(self, raw):
        self.raw = raw
        self.learning_rate = None
        self.multipliers = {}
        #: (path, global step) of servers' states loaded on this worker (rank 0) and not sent
        #: yet: the servers load them before the next step's rounds (`send_loaded_states`)
        self.loaded_states = None

    def optimizer_sent(self, optimizer):
        """After `optimizer` reached the servers: its rate, and no multipliers yet."""
        self.learning_rate = optimizer.lr
        self.multipliers = {}

    def before_push(self, planner):
        """What the servers need before any round of `planner`'s keys (a push's too): the
        packings of new groups, then the states loaded since (cut by those packings)."""
        self.send_packings(planner)
        self.send_loaded_states(planner)

    def before_step(self, planner, plan, optimizer):
        """Sends what changed before the step of `plan`'s groups."""
        self.before_push(planner)
        self.send_learning_rate(optimizer)
        self.send_multipliers(plan)

    def send_packings(self, planner):
        """Tells the servers the packings of new groups, before their first push."""
        packings = planner.new_packings()
        if packings:
            servers.send_command(self.raw, servers.group_packings_command(packings))

    def load_states_later(self, path, global_step):
        """The servers are to load the states file `path` (after `global_step` steps) before
        the next step. Not now: the next step's plan may lay the keys out anew (the first
        step fuses small parameters), and each server keeps only the pieces it holds in the
        layout of the rounds that follow."""
        self.loaded_states = (path, global_step)

    def send_loaded_states(self, planner):
        """Has the servers load the states of load_states_later, cut for `planner`'s keys
        (whose packings they know: send_packings first)."""
        if self.loaded_states is None:
            return
        path, global_step = self.loaded_states
        keys = [part.key for group in planner.holding_groups() for part in group.parts]
        servers.send_command(self.raw, servers.load_states_command(path, global_step, keys))
        self.loaded_states = None

    def send_learning_rate(self, optimizer):
        """Sends a learning rate set on the worker (Trainer.set_learning_rate) to the servers,
        which MXNet's dist stores never do (apache/mxnet#15919)."""
        lr = optimizer.lr
        if lr == self.learning_rate or optimizer.lr_scheduler is not None:
            return
        # Steps already pushed keep the old rate: let them reach the servers first (a rare
        # stall: learning rates change once an epoch or so).
        mx.nd.waitall()
        servers.send_command(self.raw, servers.learning_rate_command(lr))
        self.learning_rate = lr
        LOG.info("odsgd: learning rate %g sent to the servers", lr)

    def send_multipliers(self, plan):
        """Sends Gluon Parameters' lr_mult / wd_mult to the servers when they are new or
        changed (odsgd/common/rates.py: the pickled optimizer loses them)."""
        changed = {}
        for position, (group, _) in enumerate(plan.groups):
            for index, param in zip(group.indices, plan.params[position]):
                if param is not None and \
                        self.multipliers.get(index) != (param.lr_mult, param.wd_mult):
                    changed[index] = (param.lr_mult, param.wd_mult)
        if changed:
            mx.nd.waitall()   # steps already pushed keep the multipliers they were made with
            servers.send_command(self.raw, servers.multipliers_command(changed))
            self.multipliers.update(changed)
