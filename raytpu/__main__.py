import sys

from raytpu.cli import main

sys.exit(main())
