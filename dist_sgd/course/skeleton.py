"""The learner's file, generated from the reference's own source: it cannot drift from it.

The reference marks each exercise region inside its definition with two comment lines:

    def average_gradients(model, flat=False, all_reduce=None):
        ...                                    # kept: signature, docstring, argument checks
        # ---- exercise average_gradients: what to write
        ...                                    # the reference's code
        # ---- end of exercise

skeleton() keeps the exercise's definitions (top level, same names and signatures) and
everything in them outside the regions, replaces each region by a `raise NotImplementedError`
that says what to write and where the hint is, and puts above them the imports the reference
uses plus the reference module's own helpers they call. reference() is the same file with the
regions kept: the library's answer, in the learner's place (the suite proves it passes).
"""
import ast
import re
import textwrap

START = re.compile(r"^(\s*)# ---- exercise (\w+): (.*)$")
END = re.compile(r"^\s*# ---- end of exercise\s*$")


def _definitions(tree, symbols, path):
    found = {}
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and node.name in symbols:
            found[node.name] = node
    missing = [s for s in symbols if s not in found]
    if missing:
        raise ValueError(f"{path} defines no top-level {', '.join(missing)}")
    return [found[s] for s in symbols]


def _names_used(nodes):
    used = set()
    for node in nodes:
        for sub in ast.walk(node):
            if isinstance(sub, ast.Name):
                used.add(sub.id)
    return used


def _imports(tree, used):
    """The reference's import lines whose names the definitions use (course's own left out)."""
    lines = []
    for node in tree.body:
        if isinstance(node, ast.Import):
            keep = [a for a in node.names if (a.asname or a.name.split(".")[0]) in used]
            if keep:
                lines.append(ast.unparse(ast.Import(names=keep)))
        elif isinstance(node, ast.ImportFrom) and node.module != "dist_sgd.plumbing.mine":
            keep = [a for a in node.names if (a.asname or a.name) in used]
            if keep:
                lines.append(ast.unparse(ast.ImportFrom(module=node.module, names=keep,
                                                        level=node.level)))
    return lines


def _helpers(tree, used, symbols):
    """Top-level names of the reference module (functions, classes, constants) they use."""
    defined = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            defined.add(node.name)
        elif isinstance(node, ast.Assign):
            defined |= {t.id for t in node.targets if isinstance(t, ast.Name)}
    return sorted((defined & used) - set(symbols))


def _blank(lines, exercise, hint_command):
    """Replace each region of `lines` (a definition's source lines) by a raise."""
    out, inside = [], None
    for number, line in enumerate(lines, 1):
        start = START.match(line)
        if start:
            if start.group(2) != exercise.name:
                raise ValueError(f"region of exercise {start.group(2)!r} inside {exercise.name}")
            inside = start
            continue
        if END.match(line):
            if inside is None:
                raise ValueError(f"{exercise.source}: an end of exercise without its start")
            indent, what = inside.group(1), inside.group(3).strip()
            message = f"{what}; hint: {hint_command}"
            out.append(f"{indent}# ---- your code: {what}")
            out += _raise(indent, message)
            inside = None
            continue
        if inside is None:
            out.append(line)
    if inside is not None:
        raise ValueError(f"{exercise.source}: exercise {exercise.name} has no end of exercise")
    return out


def _raise(indent, message):
    """`raise NotImplementedError(message)`, its string cut into lines of at most 100."""
    pieces = textwrap.wrap(message, 96 - len(indent) - 4, break_long_words=False,
                           break_on_hyphens=False)
    pieces = [p + " " for p in pieces[:-1]] + pieces[-1:]
    return [f"{indent}raise NotImplementedError("] + \
        [f"{indent}    {p!r}" for p in pieces[:-1]] + [f"{indent}    {pieces[-1]!r})"]


def _end(lines, last):
    """A region that closes a definition ends after its last statement, where ast's end_lineno
    stops: take the comment lines that follow, up to the end marker."""
    for number in range(last, len(lines)):
        line = lines[number]
        if END.match(line):
            return number + 1
        if line.strip() and not line.lstrip().startswith("#"):
            break
    return last


def _strip_markers(lines):
    return [line for line in lines if not (START.match(line) or END.match(line))]


def _build(exercise, blank):
    path = exercise.source_path
    with open(path) as f:
        source = f.read()
    tree = ast.parse(source)
    definitions = _definitions(tree, exercise.symbols, path)
    used = _names_used(definitions)
    lines = source.splitlines()
    header = _header(exercise, blank)
    body = _imports(tree, used)
    helpers = _helpers(tree, used, exercise.symbols)
    if helpers:
        if exercise.source.endswith(".py"):
            raise ValueError(f"{exercise.name}: a lesson's exercise must not call the lesson's "
                             f"other functions ({', '.join(helpers)})")
        line = f"from {exercise.source} import {', '.join(helpers)}"
        if len(line) > 100:  # one name list in parentheses, lines of at most 100
            head = f"from {exercise.source} import ("
            line = textwrap.fill(", ".join(helpers) + ")", 100, initial_indent=head,
                                 subsequent_indent=" " * len(head), break_long_words=False,
                                 break_on_hyphens=False)
        body.append(line)
    regions = 0
    for node in definitions:
        first = min([node.lineno] + [d.lineno for d in node.decorator_list])
        chunk = lines[first - 1:_end(lines, node.end_lineno)]
        regions += sum(1 for line in chunk if START.match(line))
        chunk = _blank(chunk, exercise, f"python3 -m dist_sgd.course hint {exercise.name}") \
            if blank else _strip_markers(chunk)
        body += ["", ""] + chunk
    if regions == 0:
        raise ValueError(f"{exercise.source}: no region marked for exercise {exercise.name}")
    return header + "\n".join(body) + "\n"


def _header(exercise, blank):
    lesson = exercise.lesson_file or f"lesson {exercise.lesson}"
    if not blank:
        return (f'"""The reference {exercise.name} ({exercise.source}), as a learner\'s file."""\n')
    return (f'"""Your {exercise.name}: lesson {exercise.lesson} ({lesson}).\n\n'
            + textwrap.fill(f"What to write: {exercise.what}.", 96) + "\n\n"
            "Write your code where it says NotImplementedError; keep the names and signatures.\n"
            f"    check it:      python3 -m dist_sgd.course check {exercise.name}   (--watch)\n"
            f"    a hint:        python3 -m dist_sgd.course hint {exercise.name}\n"
            f"    run on it:     DIST_SGD_MINE=<this folder> python3 {lesson}\n"
            '"""\n')


def skeleton(exercise):
    """The learner's starting file for `exercise`: its regions to write."""
    return _build(exercise, blank=True)


def reference(exercise):
    """The same file with the reference's code in the regions (the answer)."""
    return _build(exercise, blank=False)
