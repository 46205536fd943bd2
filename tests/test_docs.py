"""The documents a user reads (README.md, CONTRIBUTING.md, docs/*.md) against the repository:
every relative link and every repository path or module they name exists, no document names a
file that is not in the repository (SPEC.md, NOTES.md), the README keeps its shape, and the
user docs hold no commit hashes or issue numbers (docs/history.md may).

Reads files only: no MXNet, no processes."""
import glob
import os
import re
import unicodedata

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README = os.path.join(REPO, "README.md")
HISTORY = os.path.join(REPO, "docs", "history.md")
DOCUMENTS = sorted([README, os.path.join(REPO, "CONTRIBUTING.md")] +
                   glob.glob(os.path.join(REPO, "docs", "*.md")))
#: documents besides docs/history.md where commit hashes and issue numbers may stand: none
HISTORY_ALLOWED = set()

README_MAX_LINES = 150
#: the README's sections a user looks for (the anchors' order: figure, does it help, support,
#: limitations)
README_HEADINGS = ("Accuracy against wall time", "When it helps, and when it does not",
                   "Support matrix", "Limitations")
#: the folders whose paths a document may name in backquotes
PATH_ROOTS = ("odsgd/", "docs/", "scripts/", "tests/", "results/", "kvstore_ext/")
NOT_IN_REPOSITORY = re.compile(r"\b(SPEC|NOTES)\.md\b|\bSPEC\s*§|\bSPEC section\b")
#: a commit hash: a hex word of 7 to 40 characters holding a digit and a letter
HEX_WORD = re.compile(r"(?<![\w./-])[0-9a-f]{7,40}(?![\w-])")
ISSUE_NUMBER = re.compile(r"\bissues?\s+#?\d+|\bthe issue's\b", re.IGNORECASE)
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(([^()\s]+)(?:\s+\"[^\"]*\")?\)")
CODE_SPAN = re.compile(r"`([^`\n]+)`")
FENCE = re.compile(r"^(```|~~~)")


def _relative(path):
    return os.path.relpath(path, REPO)


def _text(path):
    with open(path, encoding="utf-8") as f:
        return f.read()


def prose_lines(path):
    """(line number, line) outside fenced code blocks: commands in fences may name output
    paths that a run creates."""
    inside = False
    for number, line in enumerate(_text(path).splitlines(), 1):
        if FENCE.match(line.strip()):
            inside = not inside
            continue
        if not inside:
            yield number, line


def heading_anchors(path):
    """GitHub's anchors of a Markdown file's headings: lower case, punctuation dropped,
    spaces to hyphens, a -N suffix for repeats."""
    anchors, seen = set(), {}
    for _, line in prose_lines(path):
        match = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not match:
            continue
        title = re.sub(r"`|\*\*|\[([^\]]*)\]\([^)]*\)", r"\1", match.group(1)).strip().lower()
        slug = "".join(ch for ch in title if ch in " -_" or unicodedata.category(ch)[0] in "LNM")
        slug = slug.replace(" ", "-")
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        anchors.add(slug if count == 0 else "%s-%d" % (slug, count))
    return anchors


def links(path):
    """(line number, target) of every relative Markdown link outside code."""
    for number, line in prose_lines(path):
        for match in LINK.finditer(CODE_SPAN.sub("", line)):
            target = match.group(1)
            if not re.match(r"^[a-z][a-z0-9+.-]*:", target):   # http:, mailto:, ...
                yield number, target


def broken_link(path, target):
    """Why `target`, linked from `path`, does not resolve (None where it does)."""
    name, _, anchor = target.partition("#")
    resolved = os.path.normpath(os.path.join(os.path.dirname(path), name)) if name else path
    if not os.path.exists(resolved):
        return "no file %s" % _relative(resolved)
    if anchor and resolved.endswith(".md") and anchor not in heading_anchors(resolved):
        return "no heading #%s in %s" % (anchor, _relative(resolved))
    return None


def named_paths(path):
    """(line number, code span) of every backquoted repository path in prose."""
    for number, line in prose_lines(path):
        for match in CODE_SPAN.finditer(line):
            span = match.group(1).strip()
            if span.startswith(PATH_ROOTS) and " " not in span.split("::")[0].rstrip("()"):
                yield number, span


def missing_path(span):
    """Why a backquoted path does not name what exists (None where it does): the file or
    folder (a glob or {a,b} pattern must match something), and a `::name` or `name()`
    after it must appear in the file."""
    span = re.sub(r"\s*\(\)$", "", span)
    path, _, names = span.partition("::")
    if not names:
        path, _, names = path.partition(":")
    if not names and path.endswith(")") and "(" in path:   # path name()
        path, names = path.rsplit(" ", 1)
    path = path.rstrip("/,.;")
    patterns = _expand_braces(path)
    found = [p for pattern in patterns for p in glob.glob(os.path.join(REPO, pattern))]
    if not found:
        return "%s does not exist" % path
    for name in filter(None, re.split(r"::|\.", names.rstrip("()"))):
        files = [f for f in found if os.path.isfile(f)]
        if files and not any(re.search(r"\b%s\b" % re.escape(name), _text(f)) for f in files):
            return "%s is not in %s" % (name, path)
    return None


def _expand_braces(pattern):
    match = re.search(r"\{([^{}]*)\}", pattern)
    if not match:
        return [pattern]
    return [expanded for choice in match.group(1).split(",")
            for expanded in _expand_braces(pattern[:match.start()] + choice +
                                           pattern[match.end():])]


def named_modules(path):
    """(line number, dotted name) of every backquoted `odsgd.x.y` in prose, also after
    `python -m`."""
    for number, line in prose_lines(path):
        for match in CODE_SPAN.finditer(line):
            module = re.match(r"^(?:python3? -m\s+)?(odsgd(?:\.\w+)+)", match.group(1).strip())
            if module:
                yield number, module.group(1)


def missing_module(dotted):
    """Why `odsgd.a.b...` names no module or name of one (None where it does): the longest
    prefix that is a module file or package, then the next part must appear in it."""
    parts = dotted.split(".")
    for end in range(len(parts), 0, -1):
        base = os.path.join(REPO, *parts[:end])
        for candidate in (base + ".py", os.path.join(base, "__init__.py")):
            if os.path.isfile(candidate):
                rest = parts[end:]
                if rest and not re.search(r"\b%s\b" % re.escape(rest[0]), _text(candidate)):
                    return "%s is not in %s" % (rest[0], _relative(candidate))
                return None
    return "no module %s" % dotted


def _problems(check):
    problems = []
    for path in DOCUMENTS:
        for number, item, problem in check(path):
            if problem:
                problems.append("%s:%d: %s: %s" % (_relative(path), number, item, problem))
    return problems


def test_the_documents_are_found():
    names = {_relative(p) for p in DOCUMENTS}
    assert {"README.md", "CONTRIBUTING.md", "docs/spec.md", "docs/history.md"} <= names, names


def test_every_relative_link_resolves():
    problems = _problems(lambda path: ((n, t, broken_link(path, t)) for n, t in links(path)))
    assert not problems, "\n".join(problems)


def test_every_backquoted_repository_path_exists():
    problems = _problems(lambda path: ((n, s, missing_path(s)) for n, s in named_paths(path)))
    assert not problems, "\n".join(problems)


def test_every_backquoted_odsgd_module_exists():
    problems = _problems(lambda path: ((n, m, missing_module(m))
                                       for n, m in named_modules(path)))
    assert not problems, "\n".join(problems)


def test_no_document_names_a_file_outside_the_repository():
    problems = _problems(lambda path: ((n, line.strip(), "names SPEC.md or NOTES.md")
                                       for n, line in enumerate(_text(path).splitlines(), 1)
                                       if NOT_IN_REPOSITORY.search(line)))
    assert not problems, "\n".join(problems)


def _history_in(path):
    if path == HISTORY or path in HISTORY_ALLOWED:
        return
    for number, line in enumerate(_text(path).splitlines(), 1):
        for word in HEX_WORD.findall(line):
            if re.search(r"[0-9]", word) and re.search(r"[a-f]", word):
                yield number, word, "a commit hash"
        for match in ISSUE_NUMBER.finditer(line):
            yield number, match.group(0), "an issue number"


def test_user_documents_hold_no_commit_hashes_or_issue_numbers():
    problems = _problems(_history_in)
    assert not problems, "\n".join(problems)


def test_the_readme_is_short_and_has_its_sections():
    lines = _text(README).splitlines()
    assert len(lines) <= README_MAX_LINES, "README.md has %d lines" % len(lines)
    headings = [line.lstrip("#").strip() for _, line in prose_lines(README)
                if line.startswith("## ")]
    missing = [h for h in README_HEADINGS if h not in headings]
    assert not missing, "README.md lacks the sections %s" % missing
    assert re.search(r"!\[[^\]]*\]\([^)]+\.png\)", _text(README)), "README.md shows no figure"
    commands = [line.split("#")[0].strip() for line in lines]
    assert "make demo" in commands and "make test" in commands, \
        "README.md must give `make demo` and `make test` as commands"


@pytest.mark.parametrize("text, expected", [
    ("at e30766c, under BBR", ["e30766c"]),
    ("results/days/paper_cluster_rn50_8w1s_056b6f3.json", []),
    ("1e-4 and 1024 and deadbee and cafe1", []),
    ("commit 0e46e72a", ["0e46e72a"]),
])
def test_the_commit_hash_pattern(text, expected):
    """The pattern flags hex words of 7-40 characters with a digit and a letter, not file
    names that carry one, numbers or words."""
    found = [w for w in HEX_WORD.findall(text)
             if re.search(r"[0-9]", w) and re.search(r"[a-f]", w)]
    assert found == expected


def test_the_anchor_and_path_checks_can_fail(tmp_path):
    """The checks above find what is missing: a link to a missing heading and file, a
    missing path and a missing function."""
    doc = tmp_path / "doc.md"
    doc.write_text("# Title here\n\n[a](#title-here) [b](#nowhere) [c](missing.md)\n")
    problems = [broken_link(str(doc), target) for _, target in links(str(doc))]
    assert problems[0] is None
    assert "no heading #nowhere" in problems[1] and "no file" in problems[2]
    assert missing_path("tests/od_reference.py::predict_step") is None
    assert "no_such_function" in missing_path("tests/od_reference.py::no_such_function")
    assert "does not exist" in missing_path("odsgd/no_such_module.py")
    assert missing_module("odsgd.bench.step_model") is None
    assert "no_such_module is not in odsgd/__init__.py" == missing_module("odsgd.no_such_module")
    assert missing_module("odsgd.kvstore.DistODSGD") is None
