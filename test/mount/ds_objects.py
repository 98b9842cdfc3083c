"""ds_objects - DeepSpeed's objects/ checked with Debian's torch 1.13
(test_deepspeed.py runs them; issue 27 (1), SPEC 7).

objects/KEY for every entry of mp rank 0's model states that holds no
tensor, objects/optim_states/KEY for rank 0's optimizer states (and
objects/optim_states/optimizer_state_dict/KEY for the entries of that
dict): each file torch.load reads to the value torch.load gives from the
archive deepspeed wrote (same types all the way down), the listing
exactly those. DeepSpeed's own classes (LossScaler, ZeroStageEnum,
fragment_address) load as stand-ins here: deepspeed is not installed;
their attributes are compared.

The hostile variant (make_hostile_objects): zero2-2r's model states saved
again by torch 1.13 with client state a DeepSpeed user could hold: an
entry that writes past 1 MiB (one string referenced 30000 times: the
pickle's memo shares it, the archive writes each reference), one nested
100 deep, beside a plain one; the first two left out with a line each,
the rest shown.
"""

import os
import shutil
import sys
import types

try:
    import torch
except ImportError:  # the caller skips with a line
    torch = None


class _Stub:
    def __init__(self, *a, **k):
        self._args = a

    def __setstate__(self, st):
        self.__dict__.update(st if isinstance(st, dict) else {"_state": st})

    def __eq__(self, o):
        return type(self) is type(o) and self.__dict__ == o.__dict__

    def __repr__(self):
        return "%s(%r)" % (type(self).__name__, self.__dict__)


class _Mod(types.ModuleType):
    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        t = type(name, (_Stub,), {"__module__": self.__name__})
        setattr(self, name, t)
        return t


def _stub_deepspeed():
    if "deepspeed" in sys.modules and not isinstance(sys.modules["deepspeed"], _Mod):
        return  # the real one
    for n in ("deepspeed.runtime.fp16.loss_scaler", "deepspeed.runtime.zero.config",
              "deepspeed.utils.tensor_fragment"):
        parts = n.split(".")
        for i in range(1, len(parts) + 1):
            m = ".".join(parts[:i])
            if m not in sys.modules:
                sys.modules[m] = _Mod(m)
                sys.modules[m].__path__ = []


def _load(path):
    _stub_deepspeed()
    return torch.load(path, map_location="cpu")


def _holds_tensor(v):
    if isinstance(v, torch.Tensor):
        return True
    if isinstance(v, dict):
        return any(_holds_tensor(k) or _holds_tensor(x) for k, x in v.items())
    if isinstance(v, (list, tuple, set, frozenset)):
        return any(_holds_tensor(x) for x in v)
    if isinstance(v, _Stub):
        return _holds_tensor(v.__dict__)
    return False


def _same(a, b):
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, float) and a != a:
        return b != b
    if isinstance(a, _Stub):
        return _same(a.__dict__, b.__dict__)
    return a == b


def expected(tagdir):
    """{objects/ NAME: value} for the tag directory deepspeed wrote."""
    names = sorted(os.listdir(tagdir))
    ms = [n for n in names if n in ("mp_rank_00_model_states.pt",
                                     "zero_pp_rank_0_mp_rank_00_model_states.pt")]
    os0 = [n for n in names if n.endswith("zero_pp_rank_0_mp_rank_00_optim_states.pt")]
    want = {}
    for k, v in _load(os.path.join(tagdir, ms[0])).items():
        if not _holds_tensor(v):
            want[k] = v
    for k, v in _load(os.path.join(tagdir, os0[0])).items():
        if not _holds_tensor(v):
            want["optim_states/" + k] = v
        elif isinstance(v, dict):
            for k2, v2 in v.items():
                if not _holds_tensor(v2):
                    want["optim_states/%s/%s" % (k, k2)] = v2
    return want


def check(ck, root, name, tagdir):
    if torch is None:
        print("%s: objects/ not checked against torch.load: no torch for this python" % name)
        return
    want = expected(tagdir)
    odir = os.path.join(root, "objects")
    got = []
    for dp, _, fns in os.walk(odir):
        got += [os.path.relpath(os.path.join(dp, f), odir) for f in fns]
    ck.eq(sorted(got), sorted(want), "%s: objects/ lists every non-tensor entry" % name)
    ck.ok(len(want) >= 12 and "global_steps" in want and "ds_config" in want and
          "optim_states/ds_version" in want,
          "%s: step counts, config and the optimizer's entries among them" % name)
    bad = [k for k in sorted(want) if k in got and
           not _same(want[k], _load(os.path.join(odir, k)))]
    ck.eq(bad, [], "%s: torch.load(objects/KEY) == torch.load(model/optim states)[KEY]" % name)
    st = os.stat(os.path.join(odir, "global_steps"))
    ck.ok(st.st_mode & 0o222 == 0, "%s: objects/ read-only" % name)


def make_hostile_objects(store, src):
    """h-objects: zero2-2r with client state that cannot be shown whole."""
    if torch is None:
        return False
    dst = os.path.join(store, "h-objects")
    shutil.copytree(src, dst)
    with open(os.path.join(dst, "latest")) as f:
        tag = os.path.join(dst, f.read().strip())
    ms = os.path.join(tag, "mp_rank_00_model_states.pt")
    sd = torch.load(ms)
    s = "x" * 100
    sd["huge"] = [s] * 30000
    deep = 1
    for _ in range(100):
        deep = [deep]
    sd["deep"] = deep
    sd["client_step"] = 7
    torch.save(sd, ms)
    return True


def check_hostile(ck, mnt, listed, log):
    if not ck.ok("h-objects" in listed, "h-objects: shown"):
        return
    odir = os.path.join(mnt, "h-objects", "objects")
    ck.ok(not os.path.exists(os.path.join(odir, "huge")),
          "h-objects: huge (past 1 MiB when written) left out")
    ck.ok(not os.path.exists(os.path.join(odir, "deep")),
          "h-objects: deep (100 levels) left out")
    ck.ok('"h-objects": "huge" left out: objects/: more than 1048576 bytes' in log,
          "h-objects: the log says why huge is left out")
    ck.ok('"h-objects": "deep" left out: objects/: nested deeper than 64 levels' in log,
          "h-objects: the log says why deep is left out")
    p = os.path.join(odir, "client_step")
    ck.eq(_load(p) if os.path.exists(p) else None, 7,
          "h-objects: client_step shown, torch.load reads 7")
