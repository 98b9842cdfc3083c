"""shardfs - read and write checkpoints through a shardfs mount, from
Python (standard library + numpy; numpy is imported on first use).

Reading:

    import shardfs
    ck = shardfs.open("/mnt/ckpts/step-3000")        # a mounted checkpoint
    for name in ck.names():
        t = ck[name]                                 # dtype_name, shape, nbytes
        a = t.numpy()                                # BF16 as uint16, F8 as uint8:
        a.dtype_name                                 #   'BF16' says what the bits are
    w = ck["lm_head.weight"].numpy(float32=True)     # float32 values
    top = ck["lm_head.weight"][0:128, :]             # a box, read as tensors/NAME@0:128,:
    st = shardfs.open("/data/model.safetensors")     # any safetensors file (or the
                                                     # mount's model.safetensors)

Writing (one rank's shards, then commit; see shardfs.writer):

    shardfs.save("/mnt/ckpts", "step-3000", [
        shardfs.Shard("wq", wq_local, shape=[4096, 4096], offsets=[1024 * rank, 0]),
        shardfs.Shard("norm", norm),
    ], files={"config.json": json.dumps(cfg)})

`python3 -m shardfs` (or tools/shardfs_save.py) is the command line.
"""

import os as _os

from .checkpoint import Checkpoint
from .dtypes import DTYPES, ITEMSIZE, to_float32
from .safetensors import HEADER_MAX, SafetensorsError, SafetensorsFile
from .tensor import Tensor
from .writer import (STATE_MAX, CommitError, Shard, as_bytes, commit, declare, save,
                     state, write_file, write_shard)

__version__ = "0.1.0"

__all__ = ["open", "open_safetensors", "Checkpoint", "SafetensorsFile", "Tensor",
           "SafetensorsError", "DTYPES", "ITEMSIZE", "HEADER_MAX", "to_float32",
           "Shard", "CommitError", "STATE_MAX", "as_bytes", "declare", "write_shard",
           "write_file", "state", "commit", "save"]


def open(path, direct=None):  # noqa: A001 (shardfs.open, as the package's reader)
    """A mounted checkpoint directory (MOUNT/CKPT) as a Checkpoint, or a
    safetensors file as a SafetensorsFile (close it, or use `with`).
    direct: read this node's store files in process where the mount offers
    them (default: yes when the xxhash module is there, SHARDFS_DIRECT=0
    turns it off; see shardfs.direct)."""
    if _os.path.isdir(path):
        return Checkpoint(path, direct=direct)
    return SafetensorsFile(path)


def open_safetensors(path):
    """A safetensors file (any, or a mount's model.safetensors)."""
    return SafetensorsFile(path)
