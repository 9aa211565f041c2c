"""``python -m harness``: runs :func:`harness.cli.main`."""
import os
import sys

from harness.cli import main

try:
    sys.exit(main(prog="python -m harness"))
except BrokenPipeError:  # `python -m harness list | head`: the reader left, which is no error of ours
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    sys.exit(0)
