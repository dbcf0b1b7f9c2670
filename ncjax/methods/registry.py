"""Method registry: `config.method.name` -> Method subclass."""

from __future__ import annotations

METHODS: dict[str, type] = {}


def register(name: str):
  def deco(cls):
    if name in METHODS and METHODS[name] is not cls:
      raise ValueError(f"method {name!r} is registered twice")
    cls.name = name
    METHODS[name] = cls
    return cls
  return deco


def build_method(config, *, tokenizer, num_examples: int):
  import ncjax.methods  # noqa: F401  (registers the built-in methods)
  name = config.method.name
  if name not in METHODS:
    raise ValueError(f"unknown method {name!r}; registered methods: {sorted(METHODS)}")
  return METHODS[name](config, tokenizer=tokenizer, num_examples=num_examples)
