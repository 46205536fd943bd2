"""odsgd.launch, the old name of odsgd.cluster.launch: kept for `python -m odsgd.launch` and
the `odsgd-launch` command."""
import sys

from .cluster import launch as _module

if __name__ == "__main__":
    _module.exit_now(_module.main())
else:
    sys.modules[__name__] = _module
