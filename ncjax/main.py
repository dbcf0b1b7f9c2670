"""`python -m ncjax.main`: the command line's address from before the commands moved to `ncjax.cli.main`."""

import sys

from ncjax.cli.main import run

if __name__ == "__main__":
  sys.exit(run())
