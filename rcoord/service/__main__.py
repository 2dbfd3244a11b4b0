"""``python -m rcoord.service``: the same as ``rcoord coordinator``."""

import argparse
import sys

from .cli import add_coordinator_arguments, coordinator_main

parser = argparse.ArgumentParser(prog="rcoord coordinator", description="Run one rcoord coordinator process.")
add_coordinator_arguments(parser)
sys.exit(coordinator_main(parser.parse_args()))
