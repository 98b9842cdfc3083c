#!/usr/bin/python3
"""shardfs_save - the command line of the shardfs Python package's writer
(python/shardfs), kept here for scripts and tests that call or import it.

The code lives in the package (shardfs.writer: Shard, save, declare,
write_shard, write_file, commit, state, CommitError, as_bytes; shardfs.cli:
this command line). Importing this file imports the package from the
source tree beside it (../python), else an installed one:

    import shardfs_save as sfs            # the same names as shardfs.writer
    sfs.save("/mnt/sf", "step-3000", [sfs.Shard("norm", norm)])

CLI (see shardfs.cli):
  shardfs_save.py demo MOUNT CKPT [--rank R --world W --seed S --no-commit --check]
  shardfs_save.py commit MOUNT CKPT     commit; print the reason on failure
  shardfs_save.py state MOUNT CKPT      print user.shardfs.state
  shardfs_save.py ls PATH               tensors of a mounted checkpoint or safetensors file
"""

import os
import sys

_PY = os.path.join(os.path.dirname(os.path.realpath(__file__)), "..", "python")
if os.path.isdir(os.path.join(_PY, "shardfs")):
    sys.path.insert(0, os.path.abspath(_PY))

from shardfs.writer import *  # noqa: E402,F401,F403
from shardfs.writer import __all__  # noqa: E402,F401
from shardfs.cli import demo_check, demo_shards, demo_state_dict, main  # noqa: E402,F401

if __name__ == "__main__":
    sys.exit(main(prog="shardfs_save.py"))
