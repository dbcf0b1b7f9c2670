"""One registry mechanism for everything looked up by name: methods, evaluators, towers, geometries, datasets,
tokenizers, checkpoint formats.

A `Registry` refuses a second, different object under a name already taken (re-registering the same object, as a
module reload does, is allowed) and answers an unknown name with an error that lists the known ones.
"""

from __future__ import annotations

from typing import Callable, Generic, Iterator, TypeVar

T = TypeVar("T")


class Registry(Generic[T]):
  """Name -> object, filled with `@registry.register(name)` or `registry.add(name, obj)`."""

  def __init__(self, kind: str):
    self.kind = kind
    self._entries: dict[str, T] = {}

  def add(self, name: str, obj: T) -> T:
    if not name:
      raise ValueError(f"a {self.kind} needs a non-empty name")
    old = self._entries.get(name)
    if old is not None and old is not obj and _describe(old) != _describe(obj):
      raise ValueError(f"{self.kind} {name!r} is registered twice ({_describe(old)} and {_describe(obj)})")
    self._entries[name] = obj
    return obj

  def register(self, name: str) -> Callable[[T], T]:
    """Decorator form of `add`."""
    def deco(obj: T) -> T:
      return self.add(name, obj)
    return deco

  def get(self, name: str) -> T:
    try:
      return self._entries[name]
    except KeyError:
      raise ValueError(f"unknown {self.kind} {name!r}; registered: {sorted(self._entries)}") from None

  def __contains__(self, name: str) -> bool:
    return name in self._entries

  def __getitem__(self, name: str) -> T:
    return self.get(name)

  def __iter__(self) -> Iterator[str]:
    return iter(sorted(self._entries))

  def __len__(self) -> int:
    return len(self._entries)

  def names(self) -> list[str]:
    return sorted(self._entries)

  def items(self):
    return sorted(self._entries.items())


def _describe(obj) -> str:
  module = getattr(obj, "__module__", "")
  name = getattr(obj, "__qualname__", type(obj).__name__)
  return f"{module}.{name}" if module else name
