"""The parts of dist_sgd import downward only, in the order README.md's package map gives.

Every import of every module (at module level and inside functions, absolute or relative) is
read from the source; one that runs against the order fails here, naming the file, the line
and both parts. The ground floor (plumbing) imports nothing else of the project; the course
and the benchmark sit on top, and no part of the library imports either.
"""
import ast
import glob
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = os.path.join(ROOT, "dist_sgd")

# part -> the parts it may import besides itself. Read bottom to top: each floor may use the
# floors below it. scale (numbers and namespaces) stands beside ddp and uses only the first
# three, so that a lesson on links needs no DDP; the course and the benchmark use anything
# of the library and never each other.
BELOW = {"plumbing": set()}
BELOW["comm"] = {"plumbing"}
BELOW["sgd"] = BELOW["comm"] | {"comm"}
BELOW["ddp"] = BELOW["sgd"] | {"sgd"}
BELOW["scale"] = BELOW["sgd"] | {"sgd"}
LIBRARY_MIDDLE = BELOW["ddp"] | {"ddp", "scale"}
for part in ("shard", "beyond", "large_batch", "parallel"):
    BELOW[part] = set(LIBRARY_MIDDLE)
BELOW["faults"] = LIBRARY_MIDDLE | {"shard", "beyond", "large_batch", "parallel"}
LIBRARY = BELOW["faults"] | {"faults"}
BELOW["course"] = set(LIBRARY)
BELOW["bench"] = set(LIBRARY)
BELOW[""] = set(LIBRARY)  # dist_sgd/__init__.py


def part_of(module):
    """'dist_sgd.comm.wire' -> 'comm'; 'dist_sgd' -> ''; anything else -> None."""
    names = module.split(".")
    if names[0] != "dist_sgd":
        return None
    return names[1] if len(names) > 1 else ""


def module_name(path):
    rel = os.path.relpath(path, ROOT)[:-3].split(os.sep)
    return ".".join(rel[:-1] if rel[-1] == "__init__" else rel)


def imported(source, module, is_package):
    """(line, module imported) for every import in source, relative ones resolved."""
    base = module.split(".") if is_package else module.split(".")[:-1]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                head = ".".join(base[:len(base) - node.level + 1])
                target = head + ("." + node.module if node.module else "")
            else:
                target = node.module
            yield node.lineno, target
            for alias in node.names:  # `from dist_sgd.shard import zero` imports a part too
                yield node.lineno, f"{target}.{alias.name}"


def back_edges(source, module, is_package=False):
    """["line N: comm imports shard (dist_sgd.shard.zero)", ...] for one module's source."""
    mine = part_of(module)
    out, seen = [], set()
    for line, target in sorted(imported(source, module, is_package)):
        theirs = part_of(target)
        if theirs is None or theirs == mine or theirs == "" or (line, theirs) in seen:
            continue
        seen.add((line, theirs))
        if theirs not in BELOW:
            out.append(f"line {line}: {target}: part {theirs!r} has no place in the order "
                       "(add it to BELOW here and to README's package map)")
        elif theirs not in BELOW[mine]:
            out.append(f"line {line}: {mine or 'dist_sgd'} imports {theirs} ({target})")
    return out


MODULES = sorted(glob.glob(os.path.join(PACKAGE, "**", "*.py"), recursive=True))


@pytest.mark.parametrize("path", MODULES, ids=lambda p: os.path.relpath(p, ROOT))
def test_every_import_runs_down_the_order(path):
    with open(path) as f:
        source = f.read()
    module = module_name(path)
    assert part_of(module) in BELOW, f"{module}: a part with no place in the order (BELOW)"
    found = back_edges(source, module, path.endswith("__init__.py"))
    assert not found, f"{os.path.relpath(path, ROOT)} imports against the order:\n" + \
        "\n".join(found)


def test_the_check_sees_every_kind_of_import():
    # Module level, inside a function, relative, and a part imported by name.
    source = ("import dist_sgd.shard.zero\n"
              "def f():\n    from dist_sgd.course.exercises import get\n"
              "from ..faults import chaos\n"
              "from dist_sgd import bench\n"
              "from dist_sgd.comm.wire import Link\n"
              "from . import collectives\n")
    found = back_edges(source, "dist_sgd.comm.counted")
    assert [f.split(":")[0] for f in found] == ["line 1", "line 3", "line 4", "line 5"], found
    assert back_edges("from dist_sgd.plumbing.rank import log\n", "dist_sgd.sgd.data") == []
    assert back_edges("import torch\nfrom dist_sgd.ddp import compress\n",
                      "dist_sgd.scale.costmodel") == [
        "line 2: scale imports ddp (dist_sgd.ddp)"]


def test_the_readme_states_the_same_order():
    with open(os.path.join(ROOT, "README.md")) as f:
        readme = f.read()
    assert "plumbing" in readme and "import downward" in readme
    for part in BELOW:
        if part and os.path.isdir(os.path.join(PACKAGE, part)):
            assert f"`{part}/`" in readme, f"README's package map does not name {part}/"
