"""`python -m meta_agent` runs the CLI."""

import sys

from meta_agent.cli import main

if __name__ == "__main__":
    sys.exit(main())
