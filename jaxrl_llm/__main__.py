"""`python -m jaxrl_llm ...` runs the command line."""

import sys

from jaxrl_llm.cli import main

sys.exit(main())
