"""odsgd.server_schedules, the old name of odsgd.server.schedules: kept for the schedules
pickled in states files written before the move."""
import sys

from .server import schedules as _module

sys.modules[__name__] = _module
