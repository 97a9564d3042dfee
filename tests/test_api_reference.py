"""The API reference: pdoc builds it cleanly from the docstrings.

The reference documents every public module of ``fedjax_agg`` (no part of
its name starts with an underscore) with pdoc's Google docstring format; its
front page is the package docstring, which includes the README's opening
sections. The tests fail on

* a warning of pdoc (an unreadable docstring, a module that does not
  import, an include that does not resolve), except the known limitations
  of pdoc listed in ``_PDOC_LIMITATIONS``;
* a broken link in the site, a module page no link leads to from the front
  page, or a code reference to a ``fedjax_agg`` name that does not exist;
* a public name (in a public module's ``__all__``, or a public method of
  a public class) without a docstring.

Run as a script, this file builds the site (the README's command):

  python -m tests.test_api_reference docs_build
"""

import collections
import dataclasses
import functools
import html
import importlib
import inspect
import os
import pathlib
import pkgutil
import re
import sys
import types
import warnings

import pdoc
import pdoc.doc
import pdoc.doc_ast
import pdoc.render

import fedjax_agg

# Warnings pdoc gives on valid code: (pattern, why it is not a defect).
_PDOC_LIMITATIONS = (
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
    "csv", "json", "jsonl", "md", "npy", "npz", "pdf", "png", "py", "txt",
    "yaml"})

_DOTTED_NAME = re.compile(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+(?:\(\))?")
# pdoc renders a resolved reference as <a ...><code>x</code></a> or
# <code><a ...>x</a></code>; an unresolved one is a bare <code>x</code>.
_CODE_SPAN = re.compile(r"(<a [^>]*>)?<code>([^<]*)</code>")
# Links, and the redirect of index.html to the front page.
_HREF = re.compile(r'(?:href="|http-equiv="refresh" content="0; url=)([^"]*)"')
_ID = re.compile(r'id="([^"]*)"')


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
  for pattern, _ in _PDOC_LIMITATIONS:
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


def build(output_directory):
  """Writes the reference into ``output_directory``.

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
      if hasattr(value, part):
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
    output_directory: a site written by ``build``.

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


def _own_class_doc(cls):
  """The class's own docstring, empty for a generated or inherited one."""
  doc = (cls.__dict__.get("__doc__") or "").strip()
  if issubclass(cls, tuple) and hasattr(cls, "_fields"):
    if doc == f"{cls.__name__}({', '.join(cls._fields)})":
      return ""
  if dataclasses.is_dataclass(cls) and doc.startswith(cls.__name__ + "("):
    return ""  # the signature dataclasses writes when there is none
  return doc


def _documented_variables():
  """(module name, variable name) with a docstring, in every module."""
  found = set()
  names = ["fedjax_agg"] + [
      info.name for info in
      pkgutil.walk_packages(fedjax_agg.__path__, "fedjax_agg.")]
  for name in names:
    if name.endswith("__main__"):
      continue
    module = importlib.import_module(name)
    for var, doc in pdoc.doc_ast.walk_tree(module).var_docstrings.items():
      if doc.strip():
        found.add((name, var))
  return found


@functools.cache
def undocumented_names():
  """Public names without a docstring.

  A variable has one when a string literal follows its assignment in the
  module that assigns it (pdoc shows it on that module's page only).

  Returns:
    ``(kind, public name, where it is defined)``, kind ``"variable"`` or
    ``"api"`` (a module, class, function or public method of a public
    class), sorted; where is empty when it is the public name.
  """
  missing = {}
  documented_variables = None
  for name in public_modules():
    module = pdoc.doc.Module.from_name(name)
    if not module.docstring.strip():
      missing[(name, "")] = ("api", name, "")
    for member in getattr(module.obj, "__all__", ()):
      public = f"{name}.{member}"
      doc = module.members.get(member)
      if doc is None:
        missing[(public, "")] = ("api", public, "nowhere: not in the module")
        continue
      if isinstance(doc, pdoc.doc.Module):
        continue  # its own page is checked above
      where = ".".join(filter(None, doc.taken_from))
      if isinstance(doc, pdoc.doc.Class):
        if not _own_class_doc(doc.obj):
          missing.setdefault(doc.taken_from, ("api", public, where))
        for method in doc.members.values():
          if (isinstance(method, pdoc.doc.Function)
              and not method.name.startswith("_")
              and method.taken_from[0].startswith("fedjax_agg.")
              and not method.docstring.strip()):
            missing.setdefault(method.taken_from, (
                "api", f"{public}.{method.name}",
                ".".join(method.taken_from)))
      elif isinstance(doc, pdoc.doc.Function):
        if not doc.docstring.strip():
          missing.setdefault(doc.taken_from, ("api", public, where))
      elif not doc.docstring.strip():
        if documented_variables is None:
          documented_variables = _documented_variables()
        value = getattr(module.obj, member)
        if not any(var == member
                   and getattr(sys.modules[home], member, None) is value
                   for home, var in documented_variables):
          missing[(public, "")] = ("variable", public, "")
  return sorted((kind, public, "" if where == public else where)
                for kind, public, where in set(missing.values()))


def _listing(names, kind):
  return "\n".join(
      f"  {public} (defined in {where})" if where else f"  {public}"
      for name_kind, public, where in names if name_kind == kind)


def test_reference_builds_without_warnings_or_broken_references(tmp_path):
  # FEDJAX_AGG_DOCS_DIR: where to keep the site (``.ci/run`` keeps it in
  # the ignored docs_build/ instead of building it a second time).
  output = os.environ.get("FEDJAX_AGG_DOCS_DIR") or tmp_path
  problems = [f"pdoc: {m}" for m in build(output)]
  problems += site_problems(output)
  assert not problems, "\n".join(problems)


def test_public_modules_classes_and_functions_have_docstrings():
  listing = _listing(undocumented_names(), "api")
  assert not listing, "without a docstring:\n" + listing


def test_public_variables_have_docstrings():
  listing = _listing(undocumented_names(), "variable")
  assert not listing, (
      "without a docstring (a string literal after the assignment):\n"
      + listing)


def main(argv):
  """Builds the site into ``argv[1]``; exits with 1 on pdoc's warnings."""
  if len(argv) != 2:
    sys.exit("usage: python -m tests.test_api_reference OUTPUT_DIRECTORY")
  messages = build(argv[1])
  for message in messages:
    print(f"pdoc warning: {message}", file=sys.stderr)
  print(f"API reference: {pathlib.Path(argv[1]) / 'index.html'}")
  sys.exit(1 if messages else 0)


if __name__ == "__main__":
  main(sys.argv)
