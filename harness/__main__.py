import sys

from harness.cli import main

sys.exit(main(prog="python -m harness"))
