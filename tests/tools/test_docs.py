"""The README and docs/ point at things that exist, and CI runs every test they cite.

What is checked is that names resolve, not what the prose says: no number, measurement
or behaviour a page states is checked here (the tests a sentence cites check those).

- every `python -m <module>` in the README and docs/*.md names an importable module;
- every relative link, and every repository path in backticks (`parallel/mesh.py`),
  names an existing file, in docs/results/*.md too;
- every test a page cites (`test_x.py`, `test_x.py::test_y`) exists, in docs/results too;
- no page, results file included, points at a file outside the repository;
- every test of the techniques table (docs/parallelism.md) exists and runs in the CI
  target its row names: `test` (`make test`: not marked slow), `test-system` or
  `test-ci-slow` (the Makefile's lists), and `.ci/run` runs those targets.
"""

from __future__ import annotations

import ast
import glob
import importlib.util
import os
import re
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PAGES = [os.path.join(ROOT, "README.md"), *sorted(glob.glob(os.path.join(ROOT, "docs", "*.md")))]
RESULTS = sorted(glob.glob(os.path.join(ROOT, "docs", "results", "*.md")))
# Paths outside the repository that a page must not lead a reader to (a data folder is
# `DIR` or `DATA_DIR`; papers are cited by authors and title; the shared machine's job
# lock, /tmp/multipod-heavy.lock, is no part of the project).
OUTSIDE_REPOSITORY = re.compile(
    r"\.\./shared|/work/|DESIGN\.md|fixvenv|seed paper|/tmp/multipod-heavy"
)


def _read(path: str) -> str:
    with open(path) as f:
        return f.read()


def _name(path: str) -> str:
    return os.path.relpath(path, ROOT)


def test_pages_exist_and_the_readme_is_short():
    names = {os.path.basename(p) for p in PAGES}
    for page in ("benchmarks.md", "parallelism.md", "aot-and-planning.md", "checkpoints.md"):
        assert page in names
    for page in ("performance.md", "development.md", "design.md", "README.md"):
        assert page in names
    assert len(_read(PAGES[0]).splitlines()) <= 250


@pytest.mark.parametrize("page", PAGES, ids=_name)
def test_every_python_m_module_exists(page):
    modules = set(re.findall(r"python3? -m ([A-Za-z_][\w.]*)", _read(page)))
    missing = [m for m in sorted(modules) if importlib.util.find_spec(m) is None]
    assert not missing, f"{_name(page)} runs modules that do not exist: {missing}"


@pytest.mark.parametrize("page", PAGES + RESULTS, ids=_name)
def test_every_relative_link_exists(page):
    missing = []
    for target in re.findall(r"\]\(([^)#:\s]+)(?:#[^)]*)?\)", _read(page)):
        path = os.path.normpath(os.path.join(os.path.dirname(page), target))
        if not os.path.exists(path):
            missing.append(target)
    assert not missing, f"{_name(page)} links to missing files: {missing}"


# A repository file named in backticks: `parallel/mesh.py`, `tests/conftest.py`.
REPOSITORY_PATH = re.compile(
    r"`((?:configs|parallel|input_pipeline|mlperf|launch|tests)/[\w/.-]+\.(?:py|sh|sbatch|json))`"
)


@pytest.mark.parametrize("page", PAGES + RESULTS, ids=_name)
def test_every_repository_path_exists(page):
    missing = [
        p for p in REPOSITORY_PATH.findall(_read(page)) if not os.path.exists(os.path.join(ROOT, p))
    ]
    assert not missing, f"{_name(page)} names files that do not exist: {missing}"


@pytest.mark.parametrize("page", PAGES + RESULTS, ids=_name)
def test_no_page_points_outside_the_repository(page):
    hits = [
        f"line {n}: {line.strip()}"
        for n, line in enumerate(_read(page).splitlines(), 1)
        if OUTSIDE_REPOSITORY.search(line)
    ]
    assert not hits, f"{_name(page)} points outside the repository: {hits}"


def _makefile_list(name: str) -> list[str]:
    """The words of a Makefile variable (`NAME := a b \\` continued lines) or target recipe."""
    text = _read(os.path.join(ROOT, "Makefile")).replace("\\\n", " ")
    match = re.search(rf"^{re.escape(name)} :?= (.*)$", text, re.M)
    if match:
        return match.group(1).split()
    recipe = re.search(rf"^{re.escape(name)}:.*\n\t(.*)$", text, re.M)
    assert recipe, f"the Makefile has no {name}"
    return recipe.group(1).split()


def _slow_tests(path: str) -> tuple[bool, set[str]]:
    """(whole module slow, names of functions marked slow) of a test file."""
    tree = ast.parse(_read(path))
    module_slow = any(
        isinstance(node, ast.Assign)
        and any(getattr(t, "id", "") == "pytestmark" for t in node.targets)
        and "slow" in ast.unparse(node.value)
        for node in tree.body
    )
    slow = {
        node.name
        for node in tree.body
        if isinstance(node, ast.FunctionDef)
        and any("mark.slow" in ast.unparse(d) for d in node.decorator_list)
    }
    return module_slow, slow


def _functions(path: str) -> set[str]:
    return {n.name for n in ast.parse(_read(path)).body if isinstance(n, ast.FunctionDef)}


def _test_path(file: str) -> str:
    """tests/<kind>/<file>: the test module of that name (tests are grouped by kind)."""
    found = glob.glob(os.path.join(ROOT, "tests", "*", file))
    return found[0] if found else os.path.join(ROOT, "tests", file)


def _cited_tests() -> list[tuple[str, str, str]]:
    """(file, function or '', CI target) for every test in the techniques table's last column."""
    text = _read(os.path.join(ROOT, "docs", "parallelism.md"))
    table = text[text.index("## The techniques table") :].split("\n## ")[0]
    cited = []
    for row in [line for line in table.splitlines() if line.startswith("| ")][2:]:
        cell = row.strip("| ").split(" | ")[-1]
        # "`a.py::f`, `b.py` (test); `c.py` (test-ci-slow)": tests, then their target.
        for group, target in re.findall(r"([^()]*)\(([\w-]+)\)", cell):
            for ref in re.findall(r"`(test_\w+\.py)(?:::(\w+?)(\*)?)?`", group):
                file, func, star = ref
                cited.append((file, func + star, target))
    return cited


def test_every_techniques_table_row_cites_tests():
    text = _read(os.path.join(ROOT, "docs", "parallelism.md"))
    table = text[text.index("## The techniques table") :].split("\n## ")[0]
    rows = [line for line in table.splitlines() if line.startswith("| ")][2:]
    assert len(rows) >= 15
    for row in rows:
        assert re.search(r"`test_\w+\.py.*\((test|test-system|test-ci-slow)\)", row), row


def test_ci_runs_every_test_the_techniques_table_cites():
    ci = _read(os.path.join(ROOT, ".ci", "run"))
    for target in ("make test\n", "make test-system\n", "make test-ci-slow\n", "make quality\n"):
        assert target in ci
    # test-system runs two lists: the system tests, and the TPU compiles one per process.
    recipe = " ".join(_makefile_list("test-system"))
    assert "$(SYSTEM_TESTS)" in recipe and "$(AOT_SYSTEM_TESTS)" in recipe
    system = _makefile_list("SYSTEM_TESTS") + _makefile_list("AOT_SYSTEM_TESTS")
    ci_slow = _makefile_list("CI_SLOW_TESTS")
    cited = _cited_tests()
    assert len(cited) >= 30
    for file, func, target in cited:
        path = _test_path(file)
        assert os.path.exists(path), f"{file} does not exist"
        functions = _functions(path)
        names = [f for f in functions if f.startswith(func.rstrip("*"))] if func else []
        if func:
            assert names, f"{file}::{func} does not exist"
        module_slow, slow = _slow_tests(path)
        if target == "test":
            # `make test` runs what is not marked slow: the cited tests must not be.
            assert not module_slow, f"{file} is slow but cited as run by `make test`"
            assert not (set(names) & slow), f"{file}::{func} is slow, not in `make test`"
        else:
            listed = system if target == "test-system" else ci_slow
            node = f"{os.path.relpath(path, ROOT)}::{func}"
            folder = os.path.relpath(os.path.dirname(path), ROOT)
            assert folder in listed, f"{node} is not in {target}'s folders {listed}"
            assert module_slow or not func or set(names) <= slow, f"{node} is not marked slow"


@pytest.mark.parametrize("page", PAGES + RESULTS, ids=_name)
def test_every_cited_test_exists(page):
    missing = []
    for file, func in re.findall(r"(test_\w+\.py)(?:::(\w+))?", _read(page)):
        path = _test_path(file)
        if not os.path.exists(path):
            missing.append(file)
        elif func and not any(f.startswith(func) for f in _functions(path)):
            missing.append(f"{file}::{func}")
    assert not missing, f"{_name(page)} cites tests that do not exist: {missing}"


def _recipe(target: str) -> str:
    return _read(os.path.join(ROOT, "Makefile")).split(f"\n{target}:", 1)[1].split("\n\n")[0]


def test_the_test_targets_share_one_compilation_cache_and_the_full_size_compiles_do_not():
    """docs/development.md: each test target runs with one persistent compilation cache
    (tests/with_test_cache.sh); test-system's full-size TPU compiles run without it."""
    for target in ("test", "test-ci-slow", "test-slow"):
        assert "$(WITH_TEST_CACHE) $(PY) -m pytest" in _recipe(target), target
    system_lane, aot_lane = _recipe("test-system").split("for id in", 1)
    assert "$(WITH_TEST_CACHE) $(PY) -m pytest" in system_lane
    assert "MULTIPOD_TEST_CACHE= $(PY) -m pytest" in aot_lane
    assert "export MULTIPOD_TEST_CACHE" in _read(os.path.join(ROOT, ".ci", "run"))
    cache = os.environ.get("MULTIPOD_TEST_CACHE")
    if cache:  # under a test target: this process and its subprocesses use it
        import jax

        assert jax.config.jax_compilation_cache_dir == os.path.abspath(cache)
        assert os.environ["MULTIPOD_COMPILATION_CACHE"] == cache


def test_with_test_cache_makes_a_fresh_cache_and_removes_it_or_uses_the_named_one(tmp_path):
    script = os.path.join(ROOT, "tests", "with_test_cache.sh")
    show = ["sh", "-c", 'test -d "$MULTIPOD_TEST_CACHE" && echo "$MULTIPOD_TEST_CACHE"; exit 3']
    env = {k: v for k, v in os.environ.items() if k != "MULTIPOD_TEST_CACHE"}
    proc = subprocess.run(["bash", script, *show], env=env, capture_output=True, text=True)
    fresh = proc.stdout.strip()
    assert proc.returncode == 3  # the command's own exit code
    assert fresh.startswith("/tmp/multipod-test-xla.") and not os.path.exists(fresh)
    named = tmp_path / "named"
    named.mkdir()
    env["MULTIPOD_TEST_CACHE"] = str(named)
    proc = subprocess.run(["bash", script, *show], env=env, capture_output=True, text=True)
    assert proc.returncode == 3 and proc.stdout.strip() == str(named)
    assert named.is_dir()  # a cache named by the caller is the caller's to remove
