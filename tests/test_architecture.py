"""The layering of docs/architecture.md, checked on the source: which ncjax components may import which, and no
import cycles. Function-local imports count: a lazy import is still a dependency."""

import ast
import functools
import os

import pytest

from helpers import ROOT

PKG = os.path.join(ROOT, "ncjax")

# component -> the ncjax components it may import (docs/architecture.md draws the same table). Components are
# the top-level modules and sub-packages of ncjax; 'ncjax' is the package root (its __version__).
ALLOWED = {
    "registry": set(), "numerics": set(), "contract": set(), "config_lib": set(), "runtime": set(),
    "sharding": set(), "options": set(), "fileio": set(), "errors": set(), "compat": set(),
    "logging_utils": {"fileio"}, "checkpoint": {"fileio"},
    "tokenizers": {"registry"},
    "models": {"registry", "numerics", "contract"},
    "ot": {"registry", "numerics"},
    "samplers": {"numerics"},
    "losses": {"models", "ot", "samplers", "numerics", "registry", "sharding", "options"},
    "data": {"models", "tokenizers", "sharding", "registry", "numerics", "fileio"},
    "evals": {"data", "models", "sharding", "contract", "registry", "numerics", "fileio"},
    "optim": {"contract"},
    "methods": {"losses", "models", "ot", "samplers", "contract", "registry", "numerics", "options"},
    # ncjax.pretrained (imports / exports checkpoints): its own layer above models and data, below experiment.
    "pretrained": {"models", "tokenizers", "data", "config_lib", "registry", "numerics"},
    "experiment": {"data", "methods", "models", "pretrained", "tokenizers", "sharding", "checkpoint", "options",
                   "config_lib"},
    # the shipped configs (ncjax/configs/*.py, package data loaded by path): each builds its config with config_lib
    "configs": {"config_lib"},
    "train": {"ncjax", "experiment", "checkpoint", "optim", "sharding", "contract", "logging_utils", "config_lib",
              "pretrained"},
}
# ncjax.errors (the kinds of user error and how they are reported) and ncjax.compat (where the supported JAX releases
# differ) are leaves every component may import.
EVERYWHERE = {"errors", "compat"}
# The commands' `python -m` addresses at the package root: each forwards to its module in ncjax/cli and holds nothing
# else (test_no_command_module_at_the_package_root).
ROOT_SHIMS = {"main": "ncjax.cli.main", "demo": "ncjax.cli.demo"}
ALLOWED.update({shim: {"cli"} for shim in ROOT_SHIMS})
# The commands (ncjax/cli), the evaluation path, the sweep runner (ncjax/sweep: it trains and evaluates runs) and
# the test helpers may import anything; nothing below may import them.
TOP = {"train", "experiment", "evaluation", "cli", "testing", "sweep", *ROOT_SHIMS}


def _modules() -> dict[str, str]:
  mods = {}
  for dirpath, _, files in os.walk(PKG):
    for f in files:
      if f.endswith(".py"):
        path = os.path.join(dirpath, f)
        name = os.path.relpath(path, ROOT)[:-3].replace(os.sep, ".")
        mods[name[:-len(".__init__")] if name.endswith(".__init__") else name] = path
  return mods


def _resolve(name: str, mods) -> str:
  while name and name not in mods:
    name = name.rpartition(".")[0]
  return name


def import_graph() -> dict[str, set[str]]:
  """Module -> the ncjax modules it imports (anywhere in the file); a copy each test may change."""
  return {mod: set(deps) for mod, deps in _parsed_import_graph().items()}


@functools.lru_cache(maxsize=1)
def _parsed_import_graph() -> dict[str, set[str]]:
  # parsed once per process: five tests read it, and parsing the package's ~200 modules is most of their time
  mods = _modules()
  graph = {}
  for mod, path in mods.items():
    with open(path, encoding="utf-8") as f:
      tree = ast.parse(f.read())
    deps = set()
    for node in ast.walk(tree):
      if isinstance(node, ast.Import):
        deps.update(_resolve(a.name, mods) for a in node.names if a.name.split(".")[0] == "ncjax")
      elif isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "ncjax":
        for a in node.names:
          full = f"{node.module}.{a.name}"
          deps.add(full if full in mods else _resolve(node.module, mods))
    deps.discard(mod)
    graph[mod] = deps
  return graph


# Modules that form their own component inside a package (none today: `pretrained` is a package of its own).
OWN_COMPONENT: dict[str, str] = {}


def component(module: str) -> str:
  if module in OWN_COMPONENT:
    return OWN_COMPONENT[module]
  parts = module.split(".")
  return parts[1] if len(parts) > 1 else "ncjax"


def test_lower_layers_never_import_the_trainer_or_the_experiment():
  graph = import_graph()
  bad = [(m, d) for m, deps in graph.items() for d in deps
         if component(m) in ("data", "evals", "losses", "models", "ot", "samplers", "methods", "optim")
         and component(d) in TOP]
  assert not bad, f"lower layers import the top: {bad}"


def test_every_import_follows_the_layer_table():
  graph = import_graph()
  violations = []
  for mod, deps in graph.items():
    comp = component(mod)
    if comp not in ALLOWED:
      assert comp in TOP | {"ncjax"} or comp.startswith("_"), \
          f"{mod}: component {comp!r} is missing from the layer table"
      continue
    for dep in deps:
      dep_comp = component(dep)
      if dep_comp != comp and dep_comp not in ALLOWED[comp] | EVERYWHERE:
        violations.append(f"{mod} -> {dep}")
  assert not violations, "imports outside docs/architecture.md's layer table:\n" + "\n".join(sorted(violations))


def test_package_imports_form_no_cycle():
  graph = import_graph()
  index, low, stack, on_stack, cycles = {}, {}, [], set(), []
  counter = [0]

  def strongconnect(v):
    index[v] = low[v] = counter[0]
    counter[0] += 1
    stack.append(v)
    on_stack.add(v)
    for w in graph.get(v, ()):
      if w not in index:
        strongconnect(w)
        low[v] = min(low[v], low[w])
      elif w in on_stack:
        low[v] = min(low[v], index[w])
    if low[v] == index[v]:
      comp = []
      while True:
        w = stack.pop()
        on_stack.discard(w)
        comp.append(w)
        if w == v:
          break
      if len(comp) > 1:
        cycles.append(sorted(comp))

  for v in sorted(graph):
    if v not in index:
      strongconnect(v)
  assert not cycles, f"import cycles: {cycles}"


def test_the_layer_checker_sees_a_violation(tmp_path, monkeypatch):
  """The checks above can fail: a lower layer importing the trainer is reported."""
  graph = import_graph()
  graph["ncjax.losses.contrastive"] = graph["ncjax.losses.contrastive"] | {"ncjax.train"}
  monkeypatch.setattr(__import__(__name__), "import_graph", lambda: graph)
  with pytest.raises(AssertionError, match="ncjax.losses.contrastive"):
    test_lower_layers_never_import_the_trainer_or_the_experiment()
  graph["ncjax.train"] = graph["ncjax.train"] | {"ncjax.losses.contrastive"}
  with pytest.raises(AssertionError, match="import cycles"):
    test_package_imports_form_no_cycle()


def test_architecture_doc_lists_every_component():
  with open(os.path.join(ROOT, "docs", "architecture.md"), encoding="utf-8") as f:
    doc = f.read()
  missing = [c for c in ALLOWED if f"`{c}`" not in doc and f"ncjax/{c}" not in doc]
  assert not missing, f"docs/architecture.md does not mention {missing}"


def _is_main_guard(node) -> bool:
  return (isinstance(node, ast.If) and isinstance(node.test, ast.Compare)
          and isinstance(node.test.left, ast.Name) and node.test.left.id == "__name__")


def test_no_command_module_at_the_package_root():
  """The commands live in ncjax/cli. A module at the package root runs as a program only if it is one of the
  `python -m` shims, and a shim holds only its docstring, imports and the `__main__` guard calling into its
  command module."""
  graph = import_graph()
  for name in sorted(os.listdir(PKG)):
    if not name.endswith(".py"):
      continue
    with open(os.path.join(PKG, name), encoding="utf-8") as f:
      tree = ast.parse(f.read())
    mod = name[:-3]
    guarded = [node for node in tree.body if _is_main_guard(node)]
    if mod not in ROOT_SHIMS:
      assert not guarded, f"ncjax/{name} runs as a program: a command belongs in ncjax/cli"
      continue
    body = [node for node in tree.body if not (isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant))]
    extra = [ast.unparse(n).splitlines()[0] for n in body
             if not isinstance(n, (ast.Import, ast.ImportFrom)) and not _is_main_guard(n)]
    assert not extra, f"ncjax/{name} is a shim of {ROOT_SHIMS[mod]} and should hold nothing else: {extra}"
    assert guarded and ROOT_SHIMS[mod] in graph[f"ncjax.{mod}"], \
        f"ncjax/{name} does not forward to {ROOT_SHIMS[mod]}"


MAX_MODULE_LINES = 650   # a newcomer's screenful of screens: a module beyond it is split along its parts


def test_every_module_fits_the_house_limit():
  """The package's modules, the benchmarks' and the tests' alike."""
  paths = dict(_modules())
  for top in ("benchmarks", "tests", "launch"):
    for dirpath, _, files in os.walk(os.path.join(ROOT, top)):
      paths.update({os.path.relpath(os.path.join(dirpath, f), ROOT): os.path.join(dirpath, f)
                    for f in files if f.endswith(".py")})
  long = {name: n for name, path in paths.items()
          if (n := sum(1 for _ in open(path, encoding="utf-8"))) > MAX_MODULE_LINES}
  assert not long, f"modules over {MAX_MODULE_LINES} lines (split them along their parts): {long}"
