"""`python -m rigstack ...` is the `rigstack` command."""

import sys

from rigstack.main import main

sys.exit(main())
