import sys

from odsgd.bench import main

sys.exit(main())
