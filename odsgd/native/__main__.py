"""`python -m odsgd.native build|check-cuda`: compiles the fused operators (see odsgd/native/build.py)."""
import sys

from odsgd.native.build import main

sys.exit(main())
