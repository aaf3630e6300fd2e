"""Every package's docstring names every module in it: the list a reader opens a folder with.

A package docstring lists its modules one a line (or a few, comma-separated), indented, each
line starting with a module's name (`    checkpoint      checkpoints that resume ...`,
`    p2p, allreduce   ...`); dist_sgd's own lists its folders (`    comm/       lessons 02-04
...`). A module added, renamed or moved without its line fails here, naming the package and
the module.
"""
import ast
import glob
import os
import re

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = os.path.join(ROOT, "dist_sgd")
# Every folder of dist_sgd that holds Python files: a package needs its __init__.py
# (setuptools' find_packages installs no folder without one).
SUBPACKAGES = sorted({os.path.basename(os.path.dirname(p))
                      for p in glob.glob(os.path.join(PACKAGE, "*", "*.py"))})


def docstring(folder):
    path = os.path.join(folder, "__init__.py")
    assert os.path.exists(path), f"{os.path.relpath(folder, ROOT)} has no __init__.py"
    with open(path) as f:
        return ast.get_docstring(ast.parse(f.read()), clean=False) or ""


def unlisted(doc, names):
    """The names that start no indented line of doc (alone, or in a group that starts it:
    `    p2p, allreduce   what they measure`, so a long list fits a short docstring)."""
    return [n for n in names if not re.search(rf"^[ \t]+(?:[\w/]+, )*{re.escape(n)}(,|\s|$)",
                                              doc, re.MULTILINE)]


@pytest.mark.parametrize("package", SUBPACKAGES)
def test_package_docstring_names_every_module(package):
    folder = os.path.join(PACKAGE, package)
    modules = sorted(os.path.splitext(os.path.basename(p))[0]
                     for p in glob.glob(os.path.join(folder, "*.py")))
    inner = sorted(os.path.basename(os.path.dirname(p)) + "/"
                   for p in glob.glob(os.path.join(folder, "*", "__init__.py")))
    missing = unlisted(docstring(folder), [m for m in modules if m != "__init__"] + inner)
    assert not missing, f"dist_sgd/{package}/__init__.py's docstring does not name {missing}"


def test_dist_sgd_docstring_names_every_folder():
    missing = unlisted(docstring(PACKAGE), [f"{p}/" for p in SUBPACKAGES])
    assert not missing, f"dist_sgd/__init__.py's docstring does not name {missing}"


def test_the_check_catches_a_module_left_out():
    doc = "Title.\n\n    zero        ZeRO-1\n    fsdp_io     its collectives\n"
    assert unlisted(doc, ["zero", "fsdp_io"]) == []
    assert unlisted(doc, ["zero", "fsdp"]) == ["fsdp"]  # fsdp_io is not fsdp
    assert unlisted("Title: zero and fsdp.\n", ["zero"]) == ["zero"]  # named in prose only
    group = "Title.\n\n    p2p, allreduce   figures 1-2\n    a name, zero in a sentence\n"
    assert unlisted(group, ["p2p", "allreduce", "zero"]) == ["zero"]  # a group starts the line
