import sys

from pulsarlite.cli import main

sys.exit(main())
