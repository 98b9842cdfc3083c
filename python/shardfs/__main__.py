"""python3 -m shardfs: the package's command line (shardfs.cli)."""
import sys

from .cli import main

sys.exit(main(prog="python3 -m shardfs"))
