"""odsgd.kvstore, the old name of odsgd.worker.kvstore: kept for `from odsgd.kvstore import
DistODSGD`, the store's class name."""
import sys

from .worker import kvstore as _module

sys.modules[__name__] = _module
