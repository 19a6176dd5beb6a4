"""`python -m appliance` is the `appliance` command."""

import sys

from appliance.cli.main import main

sys.exit(main())
