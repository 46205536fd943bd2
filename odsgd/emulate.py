"""odsgd.emulate, the old name of odsgd.cluster.emulate: kept for `python -m odsgd.emulate`."""
import sys

from .cluster import emulate as _module

if __name__ == "__main__":
    sys.exit(_module.main())
else:
    sys.modules[__name__] = _module
