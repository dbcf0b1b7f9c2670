"""Method registry: `config.method.name` -> Method subclass (`ncjax.methods.build_method` builds one)."""

from __future__ import annotations

from ncjax.registry import Registry

METHODS: Registry = Registry("method")


def register(name: str):
  """Class decorator: register a Method subclass under `name` (also sets its `name`)."""
  def deco(cls):
    cls.name = name
    return METHODS.add(name, cls)
  return deco
