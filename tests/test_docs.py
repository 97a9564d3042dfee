"""The documentation as Markdown: a README that fits the first hour, a user
guide a reader can navigate, and no broken links.

* every relative link and image of ``README.md``, ``docs/**/*.md`` and
  every Markdown file under ``experiments/`` resolves to a file or folder
  of the repository, and a ``#anchor`` into a Markdown file to one of its
  headings (GitHub's anchors: ``docs/build.py``'s ``github_slug``);
* the README stays within 250 lines, with one install, one run and one
  test command (the test command is what ``.ci/run`` runs), the Python
  quick start near the top, and links to the guide's pages;
* the guide has a how-to page for each everyday task and its index links
  every page;
* every folder of ``experiments/`` that holds a script has a README, and
  the tutorial lists name every notebook.

The rendered site (guide and API reference together) is checked by
``tests/test_api_reference.py``.
"""

import re

import pytest

from tests._docs_util import load_docs_build
from tests._docs_util import ROOT

BUILD = load_docs_build()
README = ROOT / "README.md"
MAX_README_LINES = 250
HOWTO_PAGES = ("compare-algorithms.md", "fedbuff.md", "resume.md",
               "dp-epsilon.md", "shakespeare.md", "custom-rule.md",
               "own-model-and-data.md", "own-local-training.md",
               "lora-fine-tuning.md")

_FENCE = re.compile(r"^\s*(```|~~~)")
_CODE_SPAN = re.compile(r"`[^`\n]*`")
_LINK = re.compile(r"!?\[[^\]\n]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")


def markdown_files():
  """The Markdown whose links are checked: README, guide, experiments."""
  files = [README] + sorted((ROOT / "docs").rglob("*.md"))
  files += sorted((ROOT / "experiments").rglob("*.md"))
  return [f for f in files if f.is_file()]


def _prose_lines(text):
  """``text``'s lines outside fenced code, inline code removed."""
  fenced = False
  for line in text.splitlines():
    if _FENCE.match(line):
      fenced = not fenced
      continue
    if not fenced:
      yield _CODE_SPAN.sub("", line)


def links(text):
  """The targets of the inline links and images of Markdown ``text``."""
  return [m.group(1) for line in _prose_lines(text)
          for m in _LINK.finditer(line)]


def link_problems(path, text=None):
  """Relative links of ``path`` (whose content is ``text``, default: read
  from it) that lead nowhere, one line each."""
  if text is None:
    text = path.read_text("utf8")
  problems = []
  for href in links(text):
    if re.match(r"[a-z][a-z0-9+.-]*:", href) or href.startswith("/"):
      if href.startswith(("/", "file:")):
        problems.append(f"{href}: an absolute path")
      continue  # http:, https:, mailto:
    target, _, anchor = href.partition("#")
    if not target:
      if anchor.lower() not in BUILD.anchors(text):
        problems.append(f"{href}: no heading with the anchor #{anchor}")
      continue
    resolved = (path.parent / target).resolve()
    if ROOT not in resolved.parents and resolved != ROOT:
      problems.append(f"{href}: outside the repository")
    elif not resolved.exists():
      problems.append(f"{href}: no such file or folder")
    elif anchor and resolved.suffix == ".md":
      if anchor.lower() not in BUILD.anchors(resolved.read_text("utf8")):
        problems.append(f"{href}: no heading with the anchor #{anchor}")
  return problems


@pytest.mark.parametrize("path", markdown_files(),
                         ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(path):
  problems = link_problems(path)
  assert not problems, f"{path.relative_to(ROOT)}:\n" + "\n".join(problems)


def test_the_link_check_finds_broken_links():
  page = ROOT / "docs" / "a_page.md"  # read from the text below
  text = ("# A page\n\n## Its `section`, here\n\n[ok](#its-section-here) "
          "[gone](missing.md) [anchor](index.md#nowhere) [self](#nowhere) "
          "[fine](getting-started.md#quick-start-in-python) "
          "![figure](img/missing.png) [out](../../x.md) `[code](no.md)`\n"
          "```sh\n# [not a link](nowhere.md)\n```\n")
  problems = link_problems(page, text)
  assert problems == [
      "missing.md: no such file or folder",
      "index.md#nowhere: no heading with the anchor #nowhere",
      "#nowhere: no heading with the anchor #nowhere",
      "img/missing.png: no such file or folder",
      "../../x.md: outside the repository"], problems


@pytest.mark.parametrize("heading,anchor", [
    ("Where this library differs from Flower, and why",
     "where-this-library-differs-from-flower-and-why"),
    ("Time, availability and bytes (`config.Systems`)",
     "time-availability-and-bytes-configsystems"),
    ("DP-FedAvg: accuracy against ε", "dp-fedavg-accuracy-against-ε"),
    ("Defaults on the CPU (2026-11-27)", "defaults-on-the-cpu-2026-11-27"),
    ("FedAvg × 3 [seeds](x.md)", "fedavg--3-seeds"),
])
def test_anchors_follow_github(heading, anchor):
  assert BUILD.anchors(f"# {heading}\n") == {anchor}


def test_repeated_headings_get_numbered_anchors():
  text = "# Setting\n\n```sh\n# Setting\n```\n\n## Setting\n\n### Setting\n"
  assert BUILD.anchors(text) == {"setting", "setting-1", "setting-2"}


# ------------------------------------------------------------- the README


def _readme():
  return README.read_text("utf8")


def _section(text, heading):
  """The lines of ``## heading`` up to the next heading of level <= 2
  (a ``#`` line in fenced code is no heading)."""
  body, inside, fenced = [], False, False
  for line in text.splitlines():
    if _FENCE.match(line):
      fenced = not fenced
    elif not fenced and re.match(r"#{1,2} ", line):
      if inside:
        break
      inside = line == f"## {heading}"
      continue
    if inside:
      body.append(line)
  assert body, f"no section '## {heading}'"
  return "\n".join(body) + "\n"


def _code_blocks(text, language="sh"):
  return re.findall(rf"^```{language}\n(.*?)^```", text, re.M | re.S)


def test_readme_fits_the_first_hour():
  lines = _readme().splitlines()
  assert len(lines) <= MAX_README_LINES, (
      f"README.md has {len(lines)} lines; at most {MAX_README_LINES}: move "
      f"the details into a page of docs/")


def test_readme_has_one_install_one_run_and_one_test_command():
  text = _readme()
  install = _code_blocks(_section(text, "Install"))
  run = _code_blocks(_section(text, "Run the main job"))
  test = _code_blocks(_section(text, "Test"))
  assert len(install) == len(run) == len(test) == 1
  assert "pip install" in install[0] and "fedjax_agg" not in install[0]
  assert "pytest" not in install[0]
  assert run[0].startswith("python -m fedjax_agg ")
  assert "pip" not in run[0] and "pytest" not in run[0]
  for block in install + run + test:
    for line in block.splitlines():
      assert len(line) <= 100, f"a command line of {len(line)} characters"


def test_readme_test_command_is_what_ci_runs():
  (test,) = _code_blocks(_section(_readme(), "Test"))
  ci = {line.strip() for line in
        (ROOT / ".ci" / "run").read_text("utf8").splitlines()}
  steps = [step.strip() for step in test.strip().split("&&")]
  assert "python -m pytest -n 2 --dist loadscope -q" in steps
  for step in steps:
    assert step in ci, f"{step!r} is not a command of .ci/run"


def test_readme_quick_start_comes_early():
  lines = _readme().splitlines()
  assert "## Quick start in Python" in lines
  assert lines.index("## Quick start in Python") < 100


def test_readme_keeps_what_the_reference_includes():
  # The package docstring includes the README up to this marker (the API
  # reference's front page); without it pdoc cannot build the page.
  import fedjax_agg  # pylint: disable=import-outside-toplevel
  marker = re.search(r":end-before: (.+)", fedjax_agg.__doc__).group(1)
  assert _readme().count(marker.strip()) == 1


def test_readme_links_the_guide():
  targets = {href.partition("#")[0] for href in links(_readme())}
  assert "docs/index.md" in targets
  for name in HOWTO_PAGES:
    assert f"docs/howto/{name}" in targets, name


# -------------------------------------------------------------- the guide


def test_guide_has_a_how_to_page_for_each_everyday_task():
  for name in HOWTO_PAGES:
    assert (ROOT / "docs" / "howto" / name).is_file(), name


def test_guide_index_links_every_page():
  index = ROOT / "docs" / "index.md"
  linked = {(index.parent / href.partition("#")[0]).resolve()
            for href in links(index.read_text("utf8"))}
  pages = [p for p in (ROOT / "docs").rglob("*.md") if p != index]
  missing = [str(p.relative_to(ROOT)) for p in pages
             if p.resolve() not in linked]
  assert not missing, f"docs/index.md links no: {missing}"


def test_guide_pages_name_no_machine_paths():
  for path in markdown_files():
    text = path.read_text("utf8")
    for pattern in (r"/work/", r"/home/\w", r"/Users/\w", r"C:\\"):
      assert not re.search(pattern, text), (path, pattern)


def test_docs_build_output_is_ignored():
  ignored = (ROOT / ".gitignore").read_text("utf8").splitlines()
  assert f"/{BUILD.DEFAULT_OUT}/" in ignored


# ------------------------------------------------------------ experiments


def test_every_experiments_folder_with_a_script_has_a_readme():
  folders = [d for d in sorted((ROOT / "experiments").iterdir())
             if d.is_dir() and any(d.glob("*.py"))]
  assert len(folders) >= 10
  missing = [d.name for d in folders if not (d / "README.md").is_file()]
  assert not missing, f"experiments/ folders without a README: {missing}"


def _notebooks():
  names = sorted(p.name for p in
                 (ROOT / "experiments" / "notebooks").glob("*.ipynb"))
  assert "quickstart.ipynb" in names
  return names


@pytest.mark.parametrize("page,heading", [
    ("docs/index.md", "Tutorials"),
    ("experiments/notebooks/README.md", None),
])
def test_tutorial_lists_name_every_notebook(page, heading):
  text = (ROOT / page).read_text("utf8")
  if heading is not None:
    text = _section(text, heading)
  missing = [name for name in _notebooks() if f"`{name}`" not in text]
  assert not missing, f"{page} does not list {missing}"
