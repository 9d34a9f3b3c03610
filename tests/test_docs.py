"""The docs name what exists: every relative link in README.md and docs/ leads to a file (and a
heading) that is there, the README's files table gives each file's true line count, and every
`module.name` the docs point a reader at is defined at the top of that module. A stale statement
is a defect like a bug; these are the ones a machine can catch."""
import ast
import functools
import glob
import os
import re

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PAGES = glob.glob(os.path.join(REPO, "docs", "**", "*.md"), recursive=True)
DOCS = ["README.md", "CHANGELOG.md"] + sorted(os.path.relpath(p, REPO) for p in PAGES)


def read(path):
    with open(os.path.join(REPO, path)) as f:
        return f.read()


def prose(text):
    """The text outside ``` fences (a fence's '#' lines are code, not headings)."""
    return re.sub(r"^```.*?^```", "", text, flags=re.M | re.S)


@functools.lru_cache(maxsize=None)  # a page is parsed once, however many links lead to it
def anchors(path):
    """GitHub's heading anchors: lower case, punctuation but '-' and '_' dropped, spaces -> '-'."""
    headings = re.findall(r"^#+ (.+)$", prose(read(path)), re.M)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in headings}


def test_every_relative_link_leads_to_a_file_and_heading_that_exist():
    broken = []
    for doc in DOCS:
        for target in re.findall(r"\]\(([^)\s]+)\)", prose(read(doc))):
            if re.match(r"[a-z]+:", target):  # https:, mailto:
                continue
            path, _, anchor = target.partition("#")
            path = os.path.normpath(os.path.join(os.path.dirname(doc), path)) if path else doc
            if not os.path.exists(os.path.join(REPO, path)):
                broken.append(f"{doc}: {target} (no file)")
            elif anchor and path.endswith(".md") and anchor not in anchors(path):
                broken.append(f"{doc}: {target} (no such heading)")
    assert not broken, "\n".join(broken)


def test_the_readme_files_table_gives_true_line_counts():
    section = read("README.md").split("\n## Files", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| `([^`]+)` \| (\d+) \|", section, re.M)
    assert len(rows) >= 15, rows  # the table's format changed: this test must follow it
    wrong = [(name, lines, read(name).count("\n")) for name, lines in rows
             if read(name).count("\n") != int(lines)]
    assert not wrong, f"(file, README's lines, its lines): {wrong}"


EXTENSIONS = {"py", "jsonl", "json", "md", "png", "txt", "sh"}  # `train.jsonl` names a file


@functools.lru_cache(maxsize=None)  # a module is parsed once
def top_level_names(module):
    tree = ast.parse(read(f"{module}.py"))
    names = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
    return names


def test_every_module_name_the_docs_point_at_is_defined():
    modules = {os.path.basename(p)[:-3] for p in glob.glob(os.path.join(REPO, "*.py"))}
    missing = []
    for doc in DOCS:
        for module, name in set(re.findall(r"`(\w+)\.(\w+)[`(]", read(doc))):
            if module in modules and name not in EXTENSIONS and name not in top_level_names(module):
                missing.append(f"{doc}: {module}.{name}")
    assert not missing, "\n".join(sorted(missing))
