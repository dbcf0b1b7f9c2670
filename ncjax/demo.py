"""`python -m ncjax.demo` (`make demo`): the demo's address from before the commands moved to `ncjax.cli.demo`."""

import sys

if __name__ == "__main__":
  from ncjax.cli import demo
  sys.exit(demo.run())
