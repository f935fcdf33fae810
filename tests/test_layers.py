"""The subscriber stack imports only downward (docs/ARCHITECTURE.md, "Module map").

Every import inside the package is read from the source (module level and inside functions,
relative and absolute), so a lazy import that climbs a layer is caught too.
"""

from __future__ import annotations

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parent.parent / "hscapture"

#: the subscriber stack, top first; a module may import only modules of a LOWER rank
#: (same rank: siblings that must not import each other)
LAYERS: list[list[str]] = [
    ["stream"],
    ["subscriber"],
    ["_closing", "_durable_failures"],
    ["_registry", "_wire"],
    ["_delivery"],
    ["_unread_rows", "_headless"],
    ["_holds"],
    ["_source"],
    ["_settlement", "_ledger"],
]
#: what the stack stands on; none of these may import any module of the stack
FOUNDATIONS = {"_assembly", "_sample_tensors", "_sequence", "record", "notice", "sample", "endpoint", "errors",
               "ring", "_ring", "pinning", "_flock", "_subscriptions", "_leftover", "_fork"}

#: the producer stack, top first (the public API, the announcing side, the entry writer, and
#: what the writer stands on), with what it may use besides
PRODUCER_LAYERS: list[list[str]] = [
    ["producer"],
    ["_announcer"],
    ["_entries", "_producer_resources"],
    ["_copies", "_control", "_publish_queue"],
    ["_staging"],
]
PRODUCER_FOUNDATIONS = {"record", "notice", "endpoint", "errors", "_cuda_copy", "_ring", "ring",
                        "pinning", "_subscriptions", "_leftover", "limits", "_fork"}


def _imports(path: Path) -> set[str]:
    """Names of hscapture's own top-level modules that ``path`` imports."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level == 1:
                if node.module:
                    out.add(node.module.split(".")[0])
                else:
                    out.update(a.name for a in node.names)
            elif node.level == 0 and (node.module or "").startswith("hscapture."):
                out.add(node.module.split(".")[1])
            elif node.level == 0 and node.module == "hscapture":
                out.update(a.name for a in node.names)
        elif isinstance(node, ast.Import):
            out.update(a.name.split(".")[1] for a in node.names
                       if a.name.startswith("hscapture."))
    return out


def _rank(layers: list[list[str]] = LAYERS) -> dict[str, int]:
    return {m: len(layers) - i for i, layer in enumerate(layers) for m in layer}


def _wrong_imports(layers: list[list[str]], foundations: set[str]) -> list[str]:
    rank = _rank(layers)
    wrong = []
    for name, r in rank.items():
        for dep in sorted(_imports(PKG / f"{name}.py")):
            if dep in rank and rank[dep] >= r:
                wrong.append(f"{name} imports {dep} (not below it)")
            elif dep not in rank and dep not in foundations:
                wrong.append(f"{name} imports {dep}, which is neither below it in the stack "
                             f"nor a foundation")
    return wrong


def test_every_subscriber_module_imports_only_modules_below_it():
    wrong = _wrong_imports(LAYERS, FOUNDATIONS)
    assert not wrong, wrong


def test_every_producer_module_imports_only_modules_below_it():
    wrong = _wrong_imports(PRODUCER_LAYERS, PRODUCER_FOUNDATIONS)
    assert not wrong, wrong


#: the shard directory stack, top first: the writer and the checker, the reader, the index and
#: journals (and the reader's record of what each map served), the format they all follow
SHARD_LAYERS: list[list[str]] = [
    ["shards", "shard_check"],
    ["reader"],
    ["shard_index", "_served_ranges"],
    ["shard_format"],
]
SHARD_FOUNDATIONS = {"errors", "sample", "codec", "notice", "_flock", "_fork"}


def test_the_shard_modules_import_only_downward():
    wrong = _wrong_imports(SHARD_LAYERS, SHARD_FOUNDATIONS)
    assert not wrong, wrong


def test_no_foundation_module_imports_the_subscriber_stack():
    rank = _rank()
    wrong = [f"{name} imports {dep}" for name in sorted(FOUNDATIONS)
             if (PKG / f"{name}.py").exists()
             for dep in sorted(_imports(PKG / f"{name}.py")) if dep in rank]
    assert not wrong, wrong


def test_the_layer_reader_sees_relative_absolute_and_lazy_imports(tmp_path):
    f = tmp_path / "m.py"
    f.write_text("from . import record as rec\nfrom ._source import Source\n"
                 "import hscapture.notice\nfrom hscapture import sample\n"
                 "def lazy():\n    from .subscriber import Subscriber\n")
    assert _imports(f) == {"record", "_source", "notice", "sample", "subscriber"}


#: the SGLang plugin (hscapture/sglang), top first: the entry point, the hook, what the hook
#: uses (a recorded pass captured), what that uses (a pass read and held; the per-sample
#: bookkeeping), then what those stand on
SGLANG_LAYERS: list[list[str]] = [
    ["plugin"],
    ["hook"],
    ["pass_capture"],
    ["passes", "samples"],
    ["log_batch", "timing", "modes"],
    ["config"],
]


def _sglang_imports(path: Path) -> tuple[set[str], set[str]]:
    """(modules of hscapture.sglang, modules of hscapture) that ``path`` imports."""
    siblings: set[str] = set()
    core: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            names = [node.module.split(".")[0]] if node.module else [a.name for a in node.names]
            if node.level == 1:
                # ``from . import NAME``: a sibling module, or a constant of the package's
                # __init__ (which imports nothing: checked below)
                siblings.update(n for n in names
                                if node.module or (path.parent / f"{n}.py").exists())
            elif node.level == 2:
                core.update(names)
            elif (node.module or "").startswith("hscapture.sglang."):
                siblings.add(node.module.split(".")[2])
            elif (node.module or "").startswith("hscapture."):
                core.add(node.module.split(".")[1])
    return siblings, core


def test_the_sglang_plugin_imports_only_downward_and_never_the_subscriber_stack():
    rank = _rank(SGLANG_LAYERS)
    subscriber = {m for layer in LAYERS for m in layer}
    wrong = []
    for name, r in rank.items():
        siblings, core = _sglang_imports(PKG / "sglang" / f"{name}.py")
        for dep in sorted(siblings):
            if dep not in rank or rank[dep] >= r:
                wrong.append(f"sglang.{name} imports sglang.{dep} (not below it)")
        wrong += [f"sglang.{name} imports {dep} (the subscriber stack)"
                  for dep in sorted(core & subscriber)]
    assert not wrong, wrong
    assert _sglang_imports(PKG / "sglang" / "__init__.py") == (set(), set())
    assert {p.stem for p in (PKG / "sglang").glob("*.py")} - {"__init__", "__main__"} == \
        set(rank), "a module of hscapture/sglang is missing from SGLANG_LAYERS"
