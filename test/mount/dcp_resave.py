"""dcp_resave - two saves of the same step by Debian's torch 1.13 (issue 30, 7).

    /usr/bin/python3 dcp_resave.py DIR1 DIR2 N

Writes with torch 1.13 (save_state_dict, no_dist=True) the same state dict
twice, as a training job re-saving one step does: DIR1 with the first
values, DIR2 with the second, the same names, dtypes and shapes, so the
files have the same names and sizes. `big` is float32 of N elements:
arange(N) in DIR1, -arange(N) - 7 in DIR2 (the test computes both with
numpy); `small` is int64 arange(6) * -3 in both; `step` is 11.
Prints a JSON object: {"files": [names of DIR1's files]}.
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
    d1, d2, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
    big = torch.arange(n, dtype=torch.float32)
    small = torch.arange(6, dtype=torch.int64) * -3
    dcp.save_state_dict({"big": big, "small": small, "step": 11},
                        dcp.FileSystemWriter(d1), no_dist=True)
    dcp.save_state_dict({"big": -big - 7, "small": small, "step": 11},
                        dcp.FileSystemWriter(d2), no_dist=True)
    json.dump({"files": sorted(os.listdir(d1))}, sys.stdout)


if __name__ == "__main__":
    main()
