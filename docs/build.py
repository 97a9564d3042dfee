"""Builds the documentation site: the user guide and the API reference.

  python docs/build.py                  # into docs_build/ (ignored by git)
  python docs/build.py --out DIR

The site mirrors the repository's paths, so every relative link of the
Markdown works in it as it does in the repository:

* the user guide (``docs/**/*.md``), ``README.md`` and every
  ``experiments/**/README.md`` and ``RESULTS.md``, rendered to HTML next
  to where the Markdown is (``docs/index.md`` -> ``docs/index.html``),
  each heading with the anchor GitHub gives it;
* the files those pages link to or show (figures, CSVs, configs), copied
  to their own paths;
* the API reference, built with pdoc from the docstrings of every public
  module (no part of its name starts with ``_``): ``fedjax_agg.html`` (the
  package docstring with the README up to "Performance") and
  ``fedjax_agg/...``;
* ``index.html``, linking the guide, the README and the reference.

It exits with status 1 on a warning of pdoc that is not a known
limitation (``PDOC_LIMITATIONS``), a link to a missing page, file or
anchor, a module page no link leads to from ``index.html``, or code that
names a ``fedjax_agg`` name that does not exist
(``tests/test_api_reference.py`` runs the same checks in the suite).
"""

import argparse
import collections
import html
import importlib
import inspect
import pathlib
import pkgutil
import re
import shutil
import sys
import types
import warnings

ROOT = pathlib.Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
  sys.path.insert(0, str(ROOT))

import markdown2  # noqa: E402  (pdoc's own Markdown renderer)
import pdoc  # noqa: E402
import pdoc.render  # noqa: E402
import pygments.formatters  # noqa: E402  (pdoc's code highlighter)

import fedjax_agg  # noqa: E402
from fedjax_agg import manifest  # noqa: E402

DEFAULT_OUT = "docs_build"

# Warnings pdoc gives on valid code: (pattern, why it is not a defect).
PDOC_LIMITATIONS = (
    (re.compile(r"Error parsing type annotation .* for (?P<owner>[\w.]+)"
                r"\.__init__\. Import of \w+ failed", re.S),
     "a forward reference in a NamedTuple's field: its generated "
     "constructor belongs to no module pdoc can evaluate it in"),
    (re.compile(r"ForwardRef\('ArrayTree'\).* Import of ArrayTree failed",
                re.S),
     "optax.OptState is chex's recursive ArrayTree alias, whose forward "
     "reference resolves in chex only"),
)

# Inline code ending so names a file, not an attribute (``config.json``).
_FILE_SUFFIXES = frozenset({
    "csv", "gz", "html", "ipynb", "json", "jsonl", "md", "npy", "npz", "pdf",
    "png", "py", "sh", "tex", "toml", "txt", "yaml", "yml"})

_DOTTED_NAME = re.compile(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+(?:\(\))?")
# pdoc renders a resolved reference as <a ...><code>x</code></a> or
# <code><a ...>x</a></code>; an unresolved one is a bare <code>x</code>.
_CODE_SPAN = re.compile(r"(<a [^>]*>)?<code>([^<]*)</code>")
# Links, images, and the redirect of a page to another.
_HREF = re.compile(
    r'(?:href="|src="|http-equiv="refresh" content="0; url=)([^"]*)"')
_ID = re.compile(r'id="([^"]*)"')
_HEADING_HTML = re.compile(r"<h([1-6])>(.*?)</h\1>", re.S)
_TAG = re.compile(r"<[^>]+>")
_FENCE = re.compile(r"^\s*(```|~~~)")
_ATX_HEADING = re.compile(r"^ {0,3}(#{1,6})\s+(.*?)(?:\s+#+)?\s*$")
_MARKDOWN_LINK = re.compile(r"!?\[([^\]]*)\]\([^)]*\)")

_MARKDOWN_EXTRAS = ["fenced-code-blocks", "tables", "cuddled-lists",
                    "code-friendly"]


# ---------------------------------------------------------------- anchors


def github_slug(text: str) -> str:
  """The anchor GitHub gives a heading whose rendered text is ``text``:
  lower case, punctuation and symbols dropped (letters, digits, ``_``,
  ``-`` and spaces kept), each space a hyphen."""
  kept = re.sub(r"[^\w\- ]", "", text.strip().lower())
  return kept.replace(" ", "-")


def _unique(slugs):
  """GitHub's suffixes for repeated anchors: ``x``, ``x-1``, ``x-2``."""
  seen = collections.Counter()
  out = []
  for slug in slugs:
    out.append(slug if not seen[slug] else f"{slug}-{seen[slug]}")
    seen[slug] += 1
  return out


def heading_texts(markdown: str) -> list[str]:
  """The rendered text of every ATX heading of ``markdown``, outside
  fenced code blocks (a shell comment there is no heading)."""
  texts = []
  fenced = False
  for line in markdown.splitlines():
    if _FENCE.match(line):
      fenced = not fenced
      continue
    match = None if fenced else _ATX_HEADING.match(line)
    if match:
      text = _MARKDOWN_LINK.sub(r"\1", match.group(2))
      text = _TAG.sub("", text).replace("`", "").replace("*", "")
      texts.append(html.unescape(text))
  return texts


def anchors(markdown: str) -> set[str]:
  """The anchors of ``markdown``'s headings, as GitHub makes them."""
  return set(_unique(github_slug(t) for t in heading_texts(markdown)))


# ------------------------------------------------------------- the guide


def guide_sources(root: pathlib.Path = ROOT) -> list[pathlib.Path]:
  """The Markdown pages of the site: the guide, the README and the
  experiments' READMEs and RESULTS."""
  pages = [root / "README.md"]
  pages += sorted((root / "docs").rglob("*.md"))
  for name in ("README.md", "RESULTS.md"):
    pages += sorted((root / "experiments").rglob(name))
  return [p for p in pages if p.is_file()
          and not any(part.startswith(".") for part in
                      p.relative_to(root).parts)]


def _with_heading_ids(body: str) -> str:
  """Each ``<hN>`` of rendered Markdown with GitHub's anchor as its id."""
  headings = list(_HEADING_HTML.finditer(body))
  slugs = _unique(github_slug(html.unescape(_TAG.sub("", m.group(2))))
                  for m in headings)
  pieces, end = [], 0
  for match, slug in zip(headings, slugs, strict=True):
    level, inner = match.group(1), match.group(2)
    pieces += [body[end:match.start()],
               f'<h{level} id="{html.escape(slug)}">{inner}</h{level}>']
    end = match.end()
  return "".join(pieces) + body[end:]


def _is_relative(href: str) -> bool:
  return bool(href) and not (re.match(r"[a-z][a-z0-9+.-]*:", href)
                             or href.startswith(("#", "/")))


def _rewrite_links(body: str, source: pathlib.Path, rendered: set) -> str:
  """Links to rendered Markdown point at its HTML; a link to a folder at
  the folder's rendered README."""

  def rewrite(match):
    attribute, href = match.group(1), html.unescape(match.group(2))
    if not _is_relative(href):
      return match.group(0)
    path, hash_, anchor = href.partition("#")
    target = (source.parent / path).resolve() if path else None
    if target is not None and target.is_dir() and (
        target / "README.md") in rendered:
      path = path.rstrip("/") + "/README.md"
      target = target / "README.md"
    if target is None or target not in rendered:
      return match.group(0)
    new = path[:-len(".md")] + ".html" + hash_ + anchor
    return f'{attribute}="{html.escape(new)}"'

  return re.sub(r'(href|src)="([^"]*)"', rewrite, body)


def _page(title: str, body: str, depth: int) -> str:
  """A guide page: the navigation bar, then the rendered Markdown."""
  up = "../" * depth
  style = pygments.formatters.HtmlFormatter().get_style_defs(".codehilite")
  return f"""<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{html.escape(title)} - fedjax_agg</title>
<style>
body {{ font-family: system-ui, sans-serif; max-width: 60rem;
       margin: 0 auto; padding: 0 1rem 3rem; line-height: 1.5; }}
nav {{ padding: 0.8rem 0; border-bottom: 1px solid #ddd; }}
nav a {{ margin-right: 1.2rem; }}
pre {{ background: #f6f8fa; padding: 0.7rem; overflow-x: auto; }}
code {{ background: #f6f8fa; padding: 0 0.2rem; }}
table {{ border-collapse: collapse; display: block; overflow-x: auto; }}
th, td {{ border: 1px solid #ddd; padding: 0.3rem 0.5rem;
          vertical-align: top; }}
img {{ max-width: 100%; }}
{style}
</style>
</head>
<body>
<nav><a href="{up}index.html">fedjax_agg</a>
<a href="{up}docs/index.html">User guide</a>
<a href="{up}README.html">README</a>
<a href="{up}fedjax_agg.html">API reference</a></nav>
<main>
{body}
</main>
</body>
</html>
"""


def render_guide(out: pathlib.Path, root: pathlib.Path = ROOT) -> list:
  """Writes every page of ``guide_sources`` as HTML at its own path in
  ``out``. Returns the paths written."""
  sources = guide_sources(root)
  rendered = {p.resolve() for p in sources}
  written = []
  for source in sources:
    text = source.read_text("utf8")
    body = markdown2.markdown(text, extras=_MARKDOWN_EXTRAS)
    body = _rewrite_links(_with_heading_ids(str(body)), source.resolve(),
                          rendered)
    relative = source.relative_to(root).with_suffix(".html")
    target = out / relative
    target.parent.mkdir(parents=True, exist_ok=True)
    titles = heading_texts(text)
    target.write_text(_page(titles[0] if titles else relative.stem, body,
                            len(relative.parts) - 1), "utf8")
    written.append(target)
  return written


def link_reference_to_guide(out: pathlib.Path, root: pathlib.Path = ROOT
                            ) -> None:
  """Points the API reference's links to Markdown pages (the README's
  part on its front page) at their rendered HTML."""
  rendered = {p.resolve() for p in guide_sources(root)}
  for page in sorted(out.glob("fedjax_agg*.html")) + sorted(
      out.glob("fedjax_agg/**/*.html")):
    text = page.read_text("utf8")
    source = (root / page.relative_to(out)).resolve()
    linked = _rewrite_links(text, source, rendered)
    if linked != text:
      page.write_text(linked, "utf8")


def copy_linked_files(out: pathlib.Path, root: pathlib.Path = ROOT) -> list:
  """Copies each repository file a page of the site links to or shows
  (a figure, a CSV) and that the site lacks, to the same path in ``out``.
  Returns the paths copied."""
  copied = []
  out = out.resolve()
  for page in sorted(out.rglob("*.html")):
    for href in set(_HREF.findall(page.read_text("utf8"))):
      href = html.unescape(href)
      path = href.partition("#")[0]
      if not _is_relative(path):
        continue
      target = (page.parent / path).resolve()
      if target.exists() or out not in target.parents:
        continue
      source = root / target.relative_to(out)
      if source.is_file() and source.suffix not in (".md", ".html"):
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, target)
        copied.append(target)
  return copied


def write_index(out: pathlib.Path) -> pathlib.Path:
  """``index.html``: the guide, the README and the API reference."""
  body = """<h1>fedjax_agg documentation</h1>
<ul>
<li><a href="docs/index.html">User guide</a>: getting started, how-to
pages, concepts, algorithms, systems, privacy, performance.</li>
<li><a href="README.html">README</a>: what the library is, install, run,
test.</li>
<li><a href="fedjax_agg.html">API reference</a>: every public module,
from the docstrings.</li>
</ul>
"""
  path = out / "index.html"
  path.write_text(_page("Documentation", body, 0), "utf8")
  return path


# ---------------------------------------------------------- API reference


def public_modules():
  """Names of the modules of the reference: no part starts with ``_``."""
  names = ["fedjax_agg"]
  for info in pkgutil.walk_packages(fedjax_agg.__path__, "fedjax_agg."):
    if not any(part.startswith("_") for part in info.name.split(".")):
      names.append(info.name)
  return names


def _is_pdoc_warning(record):
  """True for a warning pdoc itself gives (not one from an import)."""
  return pathlib.Path(pdoc.__file__).parent in pathlib.Path(
      record.filename).parents


def _is_pdoc_limitation(message):
  for pattern, _ in PDOC_LIMITATIONS:
    match = pattern.search(message)
    if match is None:
      continue
    owner = match.groupdict().get("owner")
    if owner is None:
      return True
    try:
      cls = pkgutil.resolve_name(owner)
    except (ImportError, AttributeError, ValueError):
      continue
    if inspect.isclass(cls) and issubclass(cls, tuple) and hasattr(
        cls, "_fields"):
      return True
  return False


def build_reference(output_directory):
  """Writes the API reference into ``output_directory``.

  Args:
    output_directory: the folder of the site (created if missing).

  Returns:
    The messages of pdoc's warnings that are not known limitations.
  """
  pdoc.render.configure(docformat="google")
  with warnings.catch_warnings(record=True) as records:
    warnings.simplefilter("always")
    pdoc.pdoc(*public_modules(),
              output_directory=pathlib.Path(output_directory))
  messages = [str(r.message) for r in records if _is_pdoc_warning(r)]
  return [m for m in messages if not _is_pdoc_limitation(m)]


def _plan(out: pathlib.Path) -> manifest.Plan:
  """What replacing the site in ``out`` removes: the files an earlier
  build recorded in its manifest, unchanged. A folder holding anything
  else (a file no build wrote, a changed page, a folder without a
  manifest) is refused and nothing is removed."""
  if out.exists() and not out.is_dir():
    raise SystemExit(f"--out: {out} is not a folder")
  if not out.exists() or not any(out.iterdir()):
    return manifest.Plan()
  try:
    if manifest.read(str(out)) is None:
      raise ValueError(f"{out} holds files and no record of a site this "
                       f"script built ({manifest.FILE}); choose another "
                       "folder (only files it wrote are ever removed)")
    return manifest.check(str(out), overwrite=True)
  except ValueError as error:
    raise SystemExit(f"--out: {error}") from None


def _written(out: pathlib.Path) -> list[str]:
  return [str(path) for path in out.rglob("*")
          if path.is_file() and not path.is_symlink()]


def build_site(output_directory, root: pathlib.Path = ROOT):
  """The whole site (guide, README, experiments' pages, API reference,
  index) in ``output_directory``, replacing an earlier build there (only
  the files it recorded in its manifest, unchanged: ``_plan``).

  Returns:
    The messages of pdoc's warnings that are not known limitations.
  """
  out = pathlib.Path(output_directory)
  plan = _plan(out)
  with manifest.recording(str(out), plan):
    out.mkdir(parents=True, exist_ok=True)
    messages = build_reference(out)
    manifest.note(*_written(out))  # each step's files, as it ends
    render_guide(out, root)
    link_reference_to_guide(out, root)
    write_index(out)
    manifest.note(*_written(out))
    copy_linked_files(out, root)
    manifest.note(*_written(out))
  return messages


# ------------------------------------------------------------ the checks


def _class_fields(cls):
  names = set(getattr(cls, "__dataclass_fields__", {}))
  names |= set(getattr(cls, "_fields", ()))
  names |= set(getattr(cls, "__annotations__", {}))
  return names


class _Names:
  """What a code span may refer to: public modules, classes, fields."""

  def __init__(self):
    self.modules = {}   # last part of the name -> module
    self.classes = {}   # name -> public class
    self.fields = set()  # names of the fields of public classes
    for name in public_modules():
      module = importlib.import_module(name)
      self.modules[name.rpartition(".")[2]] = module
      for member in getattr(module, "__all__", ()):
        value = getattr(module, member, None)
        if inspect.isclass(value):
          self.classes[member] = value
          self.fields |= _class_fields(value)

  def is_broken(self, text):
    """Whether inline code ``text`` names a ``fedjax_agg`` name that is not.

    A reference starts at ``fedjax_agg``, at a public module's last name
    (``simulation.run``) or at a public class (``Execution.devices``);
    other dotted code (``jax.vmap``, ``info.round``) is not a reference.
    ``module.field`` with a field of a public class reads an instance's
    attribute (``options.num_rounds``) and is not broken either.

    Args:
      text: the code span's text.

    Returns:
      True for a reference whose path does not resolve.
    """
    parts = text.removesuffix("()").split(".")
    if parts[-1] in _FILE_SUFFIXES:
      return False
    if parts[0] == "fedjax_agg":
      value = fedjax_agg
    elif parts[0] in self.modules:
      value = self.modules[parts[0]]
    elif parts[0] in self.classes:
      value = self.classes[parts[0]]
    else:
      return False
    for part in parts[1:]:
      if inspect.isclass(value) and part in _class_fields(value):
        return False  # a field: its value's attributes are not known here
      # A module's own names only: a name it answers to through
      # ``__getattr__`` has moved (``fedjax_agg.deprecation``), and a
      # reference to it is a broken one.
      if (part in vars(value) if isinstance(value, types.ModuleType)
          else hasattr(value, part)):
        value = getattr(value, part)
        continue
      if isinstance(value, types.ModuleType):
        try:
          value = importlib.import_module(f"{value.__name__}.{part}")
          continue
        except ImportError:
          pass
      # ``data.validation`` reads a field of a FederatedData named ``data``.
      return not (len(parts) == 2 and parts[0] != "fedjax_agg"
                  and parts[0] in self.modules and part in self.fields)
    return False


def site_problems(output_directory):
  """Broken links, unreachable module pages and broken code references.

  Args:
    output_directory: a site written by ``build_site``.

  Returns:
    One line per problem.
  """
  root = pathlib.Path(output_directory)
  pages = {p.resolve(): p.read_text("utf8") for p in root.rglob("*.html")}
  ids = {page: set(_ID.findall(text)) for page, text in pages.items()}
  problems = []
  links = collections.defaultdict(set)
  for page, text in pages.items():
    shown = page.relative_to(root.resolve())
    for href in set(_HREF.findall(text)):
      href = html.unescape(href)
      if re.match(r"[a-z]+:", href) or "${" in href:
        continue  # http:, https:, data:; the search box's script template
      path, _, anchor = href.partition("#")
      target = (page.parent / path).resolve() if path else page
      if target.suffix == ".html":
        links[page].add(target)
      if not target.exists():
        problems.append(f"{shown}: link to missing {href}")
      elif anchor and target in ids and anchor not in ids[target]:
        problems.append(f"{shown}: link to missing anchor {href}")
  seen = set()
  todo = [(root / "index.html").resolve()]
  while todo:
    page = todo.pop()
    if page not in seen:
      seen.add(page)
      todo.extend(links[page])
  for name in public_modules():
    page = (root / (name.replace(".", "/") + ".html")).resolve()
    if page not in pages:
      problems.append(f"{name}: no page")
    elif page not in seen:
      problems.append(f"{name}: no link leads to its page from the front "
                      f"page")
  names = _Names()
  broken = collections.defaultdict(set)
  for page, text in pages.items():
    for match in _CODE_SPAN.finditer(text):
      code = html.unescape(match.group(2))
      if (match.group(1) is None and _DOTTED_NAME.fullmatch(code)
          and names.is_broken(code)):
        broken[code].add(str(page.relative_to(root.resolve())))
  for code, where in sorted(broken.items()):
    problems.append(f"`{code}` names nothing (in {', '.join(sorted(where))})")
  return problems


def main(argv=None):
  parser = argparse.ArgumentParser(
      description=__doc__.splitlines()[0],
      formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--out", default=DEFAULT_OUT,
                      help="the site's folder (default: %(default)s; an "
                      "earlier build there is replaced)")
  args = parser.parse_args(argv)
  messages = build_site(args.out)
  for message in messages:
    print(f"pdoc warning: {message}", file=sys.stderr)
  problems = site_problems(args.out)
  for problem in problems:
    print(f"site: {problem}", file=sys.stderr)
  print(f"documentation: {pathlib.Path(args.out) / 'index.html'}")
  return 1 if messages or problems else 0


if __name__ == "__main__":
  sys.exit(main())
