"""torch113 - make Debian's torch 1.13 import torch.distributed._shard on
Python 3.11 (test side only; shardfs never runs torch).

torch 1.13's sharded_tensor/metadata.py declares a dataclass field with
`field(default=TensorProperties())`, which Python 3.11 refuses (a mutable
default). install() puts a meta-path finder in front that loads exactly
that module from its source with the default turned into a
default_factory; every other module imports as usual. Importing this
module is enough; install() is idempotent.
"""

import importlib.abc
import importlib.machinery
import importlib.util
import sys

_TARGET = "torch.distributed._shard.sharded_tensor.metadata"
_OLD = "field(default=TensorProperties())"
_NEW = "field(default_factory=TensorProperties)"


class _Loader(importlib.abc.SourceLoader):
    def __init__(self, path):
        self.path = path

    def get_filename(self, fullname):
        return self.path

    def get_data(self, path):
        with open(path, "rb") as f:
            src = f.read()
        return src.replace(_OLD.encode(), _NEW.encode())


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path, target=None):
        if fullname != _TARGET:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or not spec.origin:
            return None
        return importlib.util.spec_from_file_location(
            fullname, spec.origin, loader=_Loader(spec.origin))


def install():
    if not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder())


install()
