"""The documentation site: the user guide and the API reference, built
together by ``docs/build.py``, cleanly.

The reference documents every public module of ``fedjax_agg`` (no part of
its name starts with an underscore) with pdoc's Google docstring format; its
front page is the package docstring, which includes the README's opening
sections. The guide's Markdown pages (``docs/``, the README, the
experiments' READMEs and RESULTS) are rendered beside it. The tests fail on

* a warning of pdoc (an unreadable docstring, a module that does not
  import, an include that does not resolve), except the known limitations
  of pdoc listed in ``docs/build.py``'s ``PDOC_LIMITATIONS``;
* a broken link anywhere in the site (a page, file or anchor that is not
  there), a module page no link leads to from the front page, or a code
  reference to a ``fedjax_agg`` name that does not exist;
* a public name (in a public module's ``__all__``, or a public method of
  a public class) without a docstring.

The site itself is built by the documented command:

  python docs/build.py --out docs_build
"""

import dataclasses
import functools
import importlib
import os
import pathlib
import pkgutil
import sys

import pdoc.doc
import pdoc.doc_ast

import fedjax_agg
from tests._docs_util import load_docs_build

BUILD = load_docs_build()
public_modules = BUILD.public_modules


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
  output = os.environ.get("FEDJAX_AGG_DOCS_DIR") or tmp_path / "site"
  problems = [f"pdoc: {m}" for m in BUILD.build_site(output)]
  problems += BUILD.site_problems(output)
  assert not problems, "\n".join(problems)
  # One site: the guide's pages, the README and the reference, linked from
  # its index.
  index = (pathlib.Path(output) / "index.html").read_text("utf8")
  for page in ("docs/index.html", "README.html", "fedjax_agg.html"):
    assert f'href="{page}"' in index, page
  for page in ("docs/getting-started.html", "docs/howto/resume.html",
               "experiments/robustness/README.html"):
    assert (pathlib.Path(output) / page).is_file(), page


def test_site_check_finds_broken_links_and_anchors(tmp_path):
  (tmp_path / "index.html").write_text(
      '<a href="fedjax_agg.html">x</a> <a href="gone.html">y</a> '
      '<img src="img/none.png"> <a href="page.html#nowhere">z</a> '
      '<a href="page.html#here">ok</a>')
  (tmp_path / "page.html").write_text('<h2 id="here">Here</h2>')
  problems = BUILD.site_problems(tmp_path)
  for expected in ("index.html: link to missing gone.html",
                   "index.html: link to missing img/none.png",
                   "index.html: link to missing anchor page.html#nowhere"):
    assert expected in problems, problems
  assert not any("#here" in p for p in problems)


def test_public_modules_classes_and_functions_have_docstrings():
  listing = _listing(undocumented_names(), "api")
  assert not listing, "without a docstring:\n" + listing


def test_public_variables_have_docstrings():
  listing = _listing(undocumented_names(), "variable")
  assert not listing, (
      "without a docstring (a string literal after the assignment):\n"
      + listing)
