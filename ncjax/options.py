"""Typed options read from a config section once: a method's or a loss's settings as a frozen dataclass.

A method declares its options as a frozen dataclass whose fields carry their defaults — declared once, there — and
where each lives in the config (`config.method` or `config.loss`, under the field's name unless renamed):

    @dataclasses.dataclass(frozen=True)
    class GSCOptions(Options):
      beta: float = method_option(0.7)
      tau1: float = loss_option(0.07)

`GSCOptions.from_config(config)` takes every field from its section where the config sets it, else the default.
A leaf module (it imports nothing from ncjax): losses, methods and evaluators all use it.
"""

from __future__ import annotations

import dataclasses
from typing import Any

SECTIONS = ("method", "loss")


def method_option(default: Any, *, key: str | None = None) -> Any:
  """A field read from `config.method.<key or field name>`."""
  return dataclasses.field(default=default, metadata=dict(section="method", key=key))


def loss_option(default: Any, *, key: str | None = None) -> Any:
  """A field read from `config.loss.<key or field name>`."""
  return dataclasses.field(default=default, metadata=dict(section="loss", key=key))


def nested_options(cls, *, section: str) -> Any:
  """A field holding another options class built from `config.<section>` by its own `from_config(section)` (a loss's
  options inside a method's)."""
  return dataclasses.field(default_factory=cls, metadata=dict(section=section, build=cls.from_config))


def _value(field: dataclasses.Field, value):
  if isinstance(field.default, tuple) and isinstance(value, list):
    return tuple(value)    # a config restored from JSON holds lists where tuples were written
  return value


def read_section(cls, section, *, renames: dict[str, str] | None = None, keep: tuple[str, ...] = (), **given):
  """An instance of the dataclass `cls` with each init field taken from `section` (a ConfigDict or dict) when it
  holds the field's key (`renames[field]`, else the field's name), else the field's default. Fields in `keep` are
  not settings (they keep their default); `given` fields are passed as they are (objects built from others)."""
  renames = renames or {}
  values = dict(given)
  for f in dataclasses.fields(cls):
    if not f.init or f.name in values or f.name in keep:
      continue
    key = renames.get(f.name) or f.metadata.get("key") or f.name
    if section is not None and key in section:
      values[f.name] = _value(f, section[key])
  return cls(**values)


@dataclasses.dataclass(frozen=True)
class Options:
  """Base of a method's options: every field says its section (`method_option` / `loss_option`)."""

  def wants_data_profile(self) -> bool:
    """True when a setting is left to the data ('auto'): the experiment then measures a DataProfile."""
    return False

  def from_data(self, profile) -> tuple["Options", list[str]]:
    """The options with their 'auto' settings chosen from `profile` (ncjax.data.profile.DataProfile, measured on the
    run's training pairs), and one note per choice (logged)."""
    del profile
    return self, []

  @classmethod
  def from_config(cls, config) -> "Options":
    values = {}
    for f in dataclasses.fields(cls):
      if not f.init:
        continue
      section_name = f.metadata.get("section")
      if section_name not in SECTIONS:
        raise TypeError(f"{cls.__name__}.{f.name}: declare it with method_option(...) or loss_option(...)")
      section = config[section_name]
      if "build" in f.metadata:
        values[f.name] = f.metadata["build"](section)
        continue
      key = f.metadata.get("key") or f.name
      if key in section:
        values[f.name] = _value(f, section[key])
    return cls(**values)


@dataclasses.dataclass(frozen=True)
class NoOptions(Options):
  """A method without options of its own."""
