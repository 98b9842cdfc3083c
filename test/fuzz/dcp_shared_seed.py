"""dcp_shared_seed - the fuzz_dcp seed whose entries share zstd streams.

    python3 test/fuzz/dcp_shared_seed.py > test/fuzz/corpus/dcp/seed-2.15-zstd-shared.metadata

Takes torch 2.15's own zstd save (test/fixtures/dcp/torch-2.15-ext/zstd)
and rewrites its .metadata at the opcode level (nothing is unpickled:
its classes need torch 2.x) so that several storage_data entries name
the same (file, offset, length): object `step` names `lr`'s stream
(decoded once, shared), tensor `f16` names `f32`'s (the archive read once,
then refused for f16: another dtype and shape), object `sched` names
`f32`'s too (another reader of that stream). The int of every changed
offset and length (a BININT*, or a BINGET of a memoized int) is written
as BININT; FRAME opcodes are dropped
(protocol 4 allows unframed pickles), every other opcode is copied.
"""

import os
import pickle
import pickletools
import struct
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
MD = os.path.join(HERE, "..", "fixtures", "dcp", "torch-2.15-ext", "zstd",
                  ".metadata")
SHARE = {"step": "lr", "f16": "f32", "sched": "f32"}
INTS = ("BININT", "BININT1", "BININT2", "LONG1")


class _Stub:
    def __init__(self, *args, **kw):
        self.args = args

    def __setstate__(self, state):
        if isinstance(state, dict):
            self.__dict__.update(state)


class _StubUnpickler(pickle.Unpickler):
    def find_class(self, module, name):
        return type(name, (_Stub,), {})


def main():
    with open(MD, "rb") as f:
        b = f.read()
    with open(MD, "rb") as f:
        md = _StubUnpickler(f).load()
    order = [idx.fqn for idx in md.storage_data]
    where = {idx.fqn: (info.offset, info.length)
             for idx, info in md.storage_data.items()}
    ops = list(pickletools.genops(b))
    memo, last, n = {}, None, 0
    # the int ops of each _StorageInfo's offset and length, in order
    slots = []
    for i, (op, arg, pos) in enumerate(ops):
        if op.name == "MEMOIZE":
            memo[n] = last
            n += 1
        val = memo.get(arg) if op.name in ("BINGET", "LONG_BINGET") else arg
        if op.name in ("SHORT_BINUNICODE", "BINUNICODE", "BINGET",
                       "LONG_BINGET") + INTS:
            last = val
            j = i + 1
            while ops[j][0].name == "MEMOIZE":
                j += 1
            nxt, narg, _ = ops[j]
            nval = memo.get(narg) if nxt.name in ("BINGET", "LONG_BINGET") else narg
            if val in ("offset", "length") and type(nval) is int and \
                    (nxt.name in INTS or nxt.name in ("BINGET", "LONG_BINGET")):
                slots.append(j)
        elif op.name != "MEMOIZE":
            last = None
    assert len(slots) == 2 * len(order), (len(slots), order)
    new = {}
    for k, src in SHARE.items():
        j = order.index(k)
        new[slots[2 * j]], new[slots[2 * j + 1]] = where[src]
    out = bytearray()
    for i, (op, arg, pos) in enumerate(ops):
        end = ops[i + 1][2] if i + 1 < len(ops) else len(b)
        if op.name == "FRAME":
            continue
        if i in new:
            out += b"J" + struct.pack("<i", new[i])
        else:
            out += b[pos:end]
    sys.stdout.buffer.write(bytes(out))


if __name__ == "__main__":
    main()
