"""The layer list of ``fedjax_agg/__init__.py`` is the import graph's: no
module imports a later layer, no two packages import each other (cycles),
function-local imports included, and every module is in the list."""

import ast
import collections
import os
import re

import fedjax_agg

PACKAGE = os.path.dirname(os.path.abspath(fedjax_agg.__file__))
# Edges against the order, each with why. None: the deprecated
# Systems.build_codec / build_staleness reach clock.built through the
# builder clock hands down to config, not through an import.
ALLOWED = {}


def _modules() -> dict[str, str]:
  found = {}
  for folder, _, files in os.walk(PACKAGE):
    for name in files:
      if name.endswith(".py"):
        path = os.path.join(folder, name)
        module = os.path.relpath(path[:-3], os.path.dirname(PACKAGE))
        module = module.replace(os.sep, ".").removesuffix(".__init__")
        found[module] = path
  return found


def _layers() -> dict[str, int]:
  listed = fedjax_agg.__doc__.split("Modules by layer")[1].split(
      ".. include::")[0]
  layers = {}
  for position, block in enumerate(re.split(r"\n\* ", listed)[1:]):
    for name in re.findall(r"``(fedjax_agg[\w.]*)``", block):
      layers.setdefault(name, position)
  return layers


def _imports(modules) -> list[tuple[str, str]]:
  """(importer, imported) of every import statement, anywhere in a
  module (function-local ones too)."""
  edges = []
  for module, path in modules.items():
    with open(path, encoding="utf-8") as f:
      tree = ast.parse(f.read())
    package = module if path.endswith("__init__.py") else module.rsplit(
        ".", 1)[0]
    for node in ast.walk(tree):
      if isinstance(node, ast.ImportFrom):
        base = node.module or ""
        if node.level:
          parts = package.split(".")[:len(package.split(".")) - node.level
                                      + 1]
          base = ".".join(parts + ([node.module] if node.module else []))
        targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules
                   else base for a in node.names]
      elif isinstance(node, ast.Import):
        targets = [a.name for a in node.names]
      else:
        continue
      edges += [(module, t) for t in targets
                if t.startswith("fedjax_agg.") and t in modules]
  return edges


def _layer_of(module: str, layers: dict[str, int]):
  if module == "fedjax_agg.__main__":  # ``python -m fedjax_agg``: the CLI
    module = "fedjax_agg.cli"
  parts = module.split(".")
  for end in range(len(parts), 0, -1):
    name = ".".join(parts[:end])
    if name in layers and name != "fedjax_agg":
      return name, layers[name]
  return None, None


def test_every_module_is_in_the_layer_list():
  layers = _layers()
  missing = [m for m in _modules() if m != "fedjax_agg"
             and _layer_of(m, layers)[0] is None]
  assert not missing, missing


def test_no_module_imports_a_later_layer():
  layers = _layers()
  upward = []
  for importer, imported in _imports(_modules()):
    if importer == "fedjax_agg":
      continue  # the package re-exports its contracts
    group, low = _layer_of(importer, layers)
    target, high = _layer_of(imported, layers)
    if None in (low, high):
      continue  # an unlisted module: test_every_module_is_in_the_layer_list
    if high > low and (group, target) not in ALLOWED:
      upward.append(f"{importer} -> {imported}")
  assert not upward, "\n".join(sorted(set(upward)))


def test_no_import_cycle_between_packages():
  layers = _layers()
  graph = collections.defaultdict(set)
  for importer, imported in _imports(_modules()):
    if importer == "fedjax_agg":
      continue
    a, b = _layer_of(importer, layers)[0], _layer_of(imported, layers)[0]
    if a != b and (a, b) not in ALLOWED:
      graph[a].add(b)
  # Depth-first search for a back edge.
  state, cycle = {}, []

  def visit(node, path):
    state[node] = "open"
    for nxt in sorted(graph[node]):
      if state.get(nxt) == "open":
        cycle.append(path + [nxt])
      elif nxt not in state:
        visit(nxt, path + [nxt])
    state[node] = "done"
  for node in sorted(graph):
    if node not in state:
      visit(node, [node])
  assert not cycle, cycle


def test_the_exception_is_still_needed():
  """An allowed edge that the code no longer has must leave the list."""
  edges = {(_layer_of(a, _layers())[0], _layer_of(b, _layers())[0])
           for a, b in _imports(_modules())}
  assert set(ALLOWED) <= edges
