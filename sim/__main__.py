import sys

from sim.cli import main

sys.exit(main())
