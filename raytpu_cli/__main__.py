import sys

from raytpu_cli.main import main

sys.exit(main())
