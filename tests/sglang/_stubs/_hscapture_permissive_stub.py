"""Permissive import stubs for GPU-only packages that sglang imports at module level.

Test-only, never shipped. ``install(name)`` turns the top-level module being imported
into a stub: every attribute of it (and of any ``name.*`` submodule, served by a
meta-path finder) is a placeholder. Calling a placeholder as a bare decorator returns
the decorated function (``@triton.jit``); calling it otherwise, reading an attribute
or indexing it returns another placeholder (``@triton.autotune(...)``,
``tl.constexpr``). No kernel or image transform ever runs in the tests.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types
import typing


class _PlaceholderMeta(type):
    """Placeholders are classes, so ``isinstance(x, triton.runtime.jit.JITFunction)``
    (torch does that when it finds triton) works and is simply False."""

    def __repr__(cls) -> str:
        return f"<test stub {cls.__qualname__}>"

    def __getattr__(cls, name: str):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        if cls.__qualname__.endswith(".driver") and name == "active":
            # ``triton.runtime.driver.active``: there is no GPU; code that probes it
            # (sglang's fla utils) catches the error and falls back to "cpu".
            raise RuntimeError("hscapture test stub: no GPU driver")
        return _placeholder(f"{cls.__qualname__}.{name}")

    def __call__(cls, *args, **kwargs):
        if len(args) == 1 and not kwargs and callable(args[0]):
            return args[0]  # bare decorator: @triton.jit
        return _placeholder(f"{cls.__qualname__}()")  # decorator factory, constructor

    def __getitem__(cls, item):
        return _placeholder(f"{cls.__qualname__}[]")

    def __iter__(cls):
        return iter(())

    def __or__(cls, other):
        return typing.Union[cls, other]

    def __ror__(cls, other):
        return typing.Union[other, cls]


def _placeholder(name: str):
    return _PlaceholderMeta(name.rpartition(".")[2] or name, (), {"__qualname__": name})


class _StubModule(types.ModuleType):
    def __getattr__(self, name: str):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return _placeholder(f"{self.__name__}.{name}")


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def __init__(self, root: str):
        self.root = root

    def find_spec(self, fullname, path=None, target=None):
        if fullname.startswith(self.root + "."):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        mod = _StubModule(spec.name)
        mod.__path__ = []
        return mod

    def exec_module(self, module):
        parent, _, child = module.__name__.rpartition(".")
        setattr(sys.modules[parent], child, module)


def install(module_name: str, version: str = "0.0.0+hscapture.teststub") -> None:
    mod = sys.modules[module_name]
    mod.__class__ = _StubModule
    mod.__path__ = []
    mod.__version__ = version
    mod.HSCAPTURE_TEST_STUB = True
    sys.meta_path.insert(0, _Finder(module_name))
