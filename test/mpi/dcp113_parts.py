"""dcp113_parts - a small DCP checkpoint of several files, by Debian's torch 1.13.

    /usr/bin/python3 dcp113_parts.py DIR

Writes with torch 1.13 (save_state_dict, no_dist=True, one file per item:
FileSystemWriter's single_file_per_rank=False) a state dict of three
tensors and a step counter into DIR: .metadata and __0_0.distcp ..
__0_3.distcp, files a test can spread over node-local stores.
Prints a JSON object: {"tensors": {name: [dtype, shape, hex bytes]},
"files": [DIR's file names]}.
"""

import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                "..", "interop"))
import torch113  # noqa: F401,E402  (torch 1.13 on Python 3.11)
import torch  # noqa: E402
import torch.distributed._shard.checkpoint as dcp  # noqa: E402


def main():
    d = sys.argv[1]
    sd = {"w": torch.arange(3000, dtype=torch.float32).reshape(30, 100) / 7,
          "b": torch.arange(40, dtype=torch.int64) * -3,
          "e": torch.linspace(-1, 1, 256, dtype=torch.float64),
          "step": 11}
    dcp.save_state_dict(sd, dcp.FileSystemWriter(d, single_file_per_rank=False),
                        no_dist=True)
    dt = {torch.float32: "F32", torch.int64: "I64", torch.float64: "F64"}
    out = {"tensors": {k: [dt[v.dtype], list(v.shape), v.numpy().tobytes().hex()]
                       for k, v in sd.items() if isinstance(v, torch.Tensor)},
           "files": sorted(os.listdir(d))}
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()
