"""Method registry: `config.method.name` -> Method subclass; NC-bench's rows are derived from it."""

from __future__ import annotations

from ncjax.registry import Registry

METHODS: Registry = Registry("method")


def register(name: str):
  """Class decorator: register a Method subclass under `name` (also sets its `name`)."""
  def deco(cls):
    cls.name = name
    return METHODS.add(name, cls)
  return deco


def method_class(name: str):
  """The Method subclass registered as `name` (an unknown name is an error listing the registered ones)."""
  return METHODS.get(name)


def bench_entries() -> dict:
  """{entry name: BenchEntry} of every registered method's NC-bench rows (methods by name). Two methods
  declaring the same row name is an error."""
  out = {}
  for method_name, cls in METHODS.items():
    for entry in cls.__dict__.get("bench", ()):
      if entry.name in out:
        raise ValueError(f"NC-bench row {entry.name!r} is declared by two methods ({method_name!r} and another)")
      out[entry.name] = entry
  return out
