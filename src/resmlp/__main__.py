import sys

from resmlp.cli import main

sys.exit(main())
