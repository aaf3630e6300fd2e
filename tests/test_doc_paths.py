"""Every repository path a doc quotes exists: README.md, figures/README.md, the lessons, the
tests and the library's own text (docstrings and comments).

Two forms are read: paths (`dist_sgd/comm/wire.py`, `figures/p2p.png`, `lessons/`,
`dist_sgd/beyond/{ps,local_sgd}.py`) and dotted names (`dist_sgd.comm.counted.wire_bytes`:
the module must exist, and the name after it must be defined at its top level). A path made to
be filled in (`lessons/NN_name.py`, `<name>.csv`, `*`) is a pattern, not a quote. A file that
a command writes rather than the repository holding it is quoted with the command that
writes it and its folder (`--save-figures` writes ... into figures/), never as a path that
looks committed.
"""
import ast
import glob
import itertools
import os
import re

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PATH = re.compile(r"(?<![\w./$-])((?:dist_sgd|lessons|tests|figures)/[\w./{},*<>-]*)")
DOTTED = re.compile(r"(?<![\w./-])(dist_sgd(?:\.\w+)+)")
# Placeholders: not quotes of one file (a name to fill in, a glob, an f-string's field).
PATTERN = re.compile(r"NAME|NN_|<|\*|\.\.\.|_$|\{\w*\}")


def documents():
    files = ["README.md", "figures/README.md"]
    files += sorted(os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "lessons", "*.py")))
    files += sorted(os.path.relpath(p, ROOT) for p in glob.glob(
        os.path.join(ROOT, "dist_sgd", "**", "*.py"), recursive=True))
    return files


def docstrings_of_tests():
    """The tests' module docstrings (their code quotes made-up paths on purpose)."""
    for path in sorted(glob.glob(os.path.join(ROOT, "tests", "*.py"))):
        with open(path) as f:
            yield os.path.relpath(path, ROOT), ast.get_docstring(ast.parse(f.read())) or ""


def expand(quoted):
    """'dist_sgd/beyond/{ps,hogwild}.py' -> ['dist_sgd/beyond/ps.py', 'dist_sgd/beyond/hogwild.py']."""
    parts = re.split(r"(\{[^{}]*\})", quoted)
    choices = [p[1:-1].split(",") if p.startswith("{") else [p] for p in parts]
    return ["".join(c) for c in itertools.product(*choices)]


def top_level_names(path):
    with open(path) as f:
        tree = ast.parse(f.read())
    names = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            for target in (node.targets if isinstance(node, ast.Assign) else [node.target]):
                names |= {n.id for n in ast.walk(target) if isinstance(n, ast.Name)}
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
    return names


def dotted_problem(name):
    """None when dist_sgd.a.b(.attr) names a module (and a top-level name in it), else why."""
    parts = name.split(".")
    for cut in range(len(parts), 0, -1):
        base = os.path.join(ROOT, *parts[:cut])
        module = base + ".py" if os.path.isfile(base + ".py") else (
            os.path.join(base, "__init__.py") if os.path.isdir(base) else None)
        if module is None:
            continue
        rest = parts[cut:]
        if not rest or rest[0] in top_level_names(module):
            return None
        if os.path.isdir(base):
            return f"{'.'.join(parts[:cut + 1])} is no module of {'.'.join(parts[:cut])}"
        return f"{'.'.join(parts[:cut])} defines no {rest[0]}"
    return "no such module"


def quoted(text):
    """(kind, quote) for every path and dotted name in text."""
    for match in PATH.finditer(text):
        q = match.group(1).rstrip(".,")
        if not PATTERN.search(q):
            yield "path", q
    for match in DOTTED.finditer(text):
        yield "dotted", match.group(1).rstrip(".")


def problems(text):
    out = []
    for kind, q in quoted(text):
        if kind == "path":
            missing = [p for p in expand(q) if not os.path.exists(os.path.join(ROOT, p))]
            if missing:
                out.append(f"{q}: {', '.join(missing)} does not exist")
        else:
            why = dotted_problem(q)
            if why:
                out.append(f"{q}: {why}")
    return sorted(set(out))


@pytest.mark.parametrize("doc", documents())
def test_every_quoted_path_exists(doc):
    with open(os.path.join(ROOT, doc)) as f:
        found = problems(f.read())
    assert not found, f"{doc} quotes what is not in the repository:\n" + "\n".join(found)


@pytest.mark.parametrize("doc,text", list(docstrings_of_tests()), ids=lambda v: v[:40])
def test_every_path_a_tests_docstring_quotes_exists(doc, text):
    found = problems(text)
    assert not found, f"{doc}'s docstring quotes what is not in the repository:\n" + \
        "\n".join(found)


def test_the_check_catches_a_stale_path_and_name():
    text = ("see dist_sgd/zero.py and dist_sgd/shard/zero.py, dist_sgd/beyond/{ps,gone}.py, "
            "figures/p2p.png, lessons/NN_name.py, dist_sgd.shard.zero.nothing_here, "
            "dist_sgd.comm.counted.wire_bytes, dist_sgd.faults.fsdp_checkpoint.")
    assert problems(text) == [
        "dist_sgd.faults.fsdp_checkpoint: dist_sgd.faults.fsdp_checkpoint is no module of "
        "dist_sgd.faults",
        "dist_sgd.shard.zero.nothing_here: dist_sgd.shard.zero defines no nothing_here",
        "dist_sgd/beyond/{ps,gone}.py: dist_sgd/beyond/gone.py does not exist",
        "dist_sgd/zero.py: dist_sgd/zero.py does not exist"]


MEASURED = re.compile(r"~?\b\d+(\.\d+)?\s?(ms|us|µs|s|x|GB/s)\b(?![/\w])")  # link rates are settings


def test_measured_numbers_are_quoted_once_in_figures_readme():
    """README's figure list says what each figure shows; its numbers (times, ratios, rates)
    are quoted once, in figures/README.md, beside the command that measures them."""
    with open(os.path.join(ROOT, "README.md")) as f:
        readme = f.read()
    figures = readme[readme.index("## Figures"):readme.index("## ", readme.index("## Figures") + 3)]
    quoted_here = [m.group(0) for m in MEASURED.finditer(figures)]
    assert not quoted_here, f"README.md's Figures section quotes measured numbers {quoted_here}: " \
                            "say what the figure shows, and leave its numbers to figures/README.md"
    assert MEASURED.search("a message costs ~0.1 ms") and MEASURED.search("with 19x fewer")
