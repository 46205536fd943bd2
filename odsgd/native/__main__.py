"""`python -m odsgd.native build`: compiles the fused operators (see odsgd.native.build)."""
import sys

from odsgd.native import main

sys.exit(main())
