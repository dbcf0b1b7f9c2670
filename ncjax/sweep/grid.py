"""A sweep's points: axes from `--sweep=KEY=V1,V2` (each value parsed as the type of the config's own value) or a
config file's `get_sweep(arg)`, seeds, readable run ids, the part one process or array task runs, and the
definition a workdir keeps.

A *point* is one setting of the swept keys; a *run* is a point with one seed. `--index=I` and `--shard=I/N` count
points, so every seed of a point runs in the same task.
"""

from __future__ import annotations

import ast
import dataclasses
import hashlib
import itertools
import json
import re

import ml_collections
from ml_collections import config_dict

from ncjax import config_lib, errors

# The config keys a run's seed sets: the parameters' initialisation, the data order and the injected noise, as
# NC-bench does for each of its seeds (a new draw of every random choice of the run).
SEED_KEYS = ("seed", "noise.seed", "input.shuffle_seed")
# Sections whose settings do not change what a run computes: a changed value there is not another sweep.
NEUTRAL_SECTIONS = ("log", "ckpt")


class SweepError(errors.ConfigurationError):
  """A sweep that cannot run as asked (status 2): a bad key, value, index or shard, or another sweep's workdir."""


@dataclasses.dataclass(frozen=True)
class Run:
  """One run: point `index` of the sweep with one seed (None: the config's own seeds), under WORKDIR/runs/<name>/."""
  index: int
  point: tuple            # ((dotted key, value), ...): the swept values of this point, in axis order
  seed: int | None
  name: str

  @property
  def overrides(self) -> dict:
    """Every config key this run sets: its seed's keys, then the point's values (a swept seed key wins)."""
    out = {k: self.seed for k in SEED_KEYS} if self.seed is not None else {}
    out.update(dict(self.point))
    return out


# --- values ----------------------------------------------------------------------------------------------------
def _field(config, key: str):
  """The stored field at dotted `key` (a value or a typed placeholder); SweepError naming the closest keys."""
  node = config
  parts = key.split(".")
  for i, part in enumerate(parts):
    if not isinstance(node, ml_collections.ConfigDict) or part not in node:
      close = config_lib.closest_keys(config, key)
      hint = f"; closest known keys: {', '.join(close)}" if close else ""
      raise SweepError(f"--sweep={key}=...: the config has no key {'.'.join(parts[:i + 1])!r}{hint}")
    node = node._fields.get(part)   # noqa: SLF001 (ml_collections keeps a placeholder's type only there)
  if isinstance(node, ml_collections.ConfigDict):
    raise SweepError(f"--sweep={key}=...: {key!r} is a section of the config, not a value; sweep one of its keys "
                     f"({', '.join(f'{key}.{k}' for k in list(node.keys())[:4])}, ...)")
  return node


def value_type(config, key: str) -> type | None:
  """The type a swept value of `key` is parsed as: the type of the config's value (a placeholder's declared type);
  None where the config holds None without a type."""
  field = _field(config, key)
  if isinstance(field, config_dict.FieldReference):
    return field.get_type()
  return None if field is None else type(field)


def split_values(text: str) -> list[str]:
  """'a,b,(1,2)' -> ['a', 'b', '(1,2)']: commas inside brackets or quotes belong to their value."""
  out, depth, quote, start = [], 0, "", 0
  for i, ch in enumerate(text):
    if quote:
      quote = "" if ch == quote else quote
    elif ch in "'\"":
      quote = ch
    elif ch in "([{":
      depth += 1
    elif ch in ")]}":
      depth -= 1
    elif ch == "," and depth == 0:
      out.append(text[start:i])
      start = i + 1
  out.append(text[start:])
  return [v.strip() for v in out]


def parse_value(key: str, raw: str, kind: type | None):
  """One value of `--sweep=KEY=...` as `kind`; SweepError naming the key, the value and the type expected."""
  def bad(expected):
    return SweepError(f"--sweep={key}=...: value {raw!r} is not {expected}, the type of the config's "
                      f"{key} (e.g. {key}={_example(kind)})")
  if kind is bool:
    if (flag := config_lib.parse_bool(raw)) is None:
      raise bad("a boolean")
    return flag
  if kind in (int, float):
    try:
      return kind(raw) if kind is float else int(raw, 0)
    except ValueError:
      raise bad(f"{'an' if kind is int else 'a'} {kind.__name__}") from None
  if kind is str:
    return raw
  if kind in (tuple, list):
    try:
      value = ast.literal_eval(raw)
    except (ValueError, SyntaxError):
      raise bad("a tuple") from None
    if not isinstance(value, (tuple, list)):
      raise bad("a tuple")
    return tuple(value)
  try:   # a value the config leaves untyped (None): a Python literal, else the text itself
    return ast.literal_eval(raw)
  except (ValueError, SyntaxError):
    return raw


def _example(kind) -> str:
  return {bool: "true,false", int: "1,2", float: "1e-3,3e-3", str: "a,b", tuple: "'(1,2)','(3,4)'"}.get(kind, "a,b")


def check_value(config, key: str, value):
  """A value of a config file's `get_sweep`: of the config's type (an int where a float is kept is widened)."""
  kind = value_type(config, key)
  if kind is float and isinstance(value, int) and not isinstance(value, bool):
    return float(value)
  if kind in (tuple, list) and isinstance(value, list):
    value = tuple(value)
  if kind is not None and value is not None and not isinstance(value, kind):
    raise SweepError(f"get_sweep: {key}={value!r} is a {type(value).__name__}, but the config's {key} is a "
                     f"{kind.__name__}")
  return value


def parse_axis(config, flag: str) -> tuple[str, tuple]:
  """`KEY=V1,V2,...` -> (KEY, values), each parsed as the config value's type."""
  key, sep, text = flag.partition("=")
  key = key.strip()
  if not sep or not key:
    raise SweepError(f"--sweep={flag}: expected KEY=V1,V2,... (e.g. --sweep=optim.lr=1e-3,3e-3)")
  kind = value_type(config, key)
  raws = split_values(text) if text.strip() else []
  if not raws or any(not r for r in raws):
    raise SweepError(f"--sweep={flag}: an empty list of values for {key}; give at least one, e.g. "
                     f"--sweep={key}={_example(kind)}")
  values = tuple(parse_value(key, r, kind) for r in raws)
  if len(set(map(repr, values))) < len(values):
    raise SweepError(f"--sweep={flag}: a value of {key} is listed twice")
  return key, values


# --- points and runs -------------------------------------------------------------------------------------------
def points_of(config, flags: list[str], file_points: list[dict] | None = None) -> list[tuple]:
  """Every point: a config file's points (get_sweep) crossed with the --sweep axes (the first axis outermost)."""
  axes = [parse_axis(config, f) for f in flags]
  keys = [k for k, _ in axes]
  if len(set(keys)) < len(keys):
    raise SweepError(f"--sweep names a key twice: {sorted(k for k in set(keys) if keys.count(k) > 1)}")
  base = [()]
  if file_points is not None:
    if not isinstance(file_points, (list, tuple)) or not file_points:
      raise SweepError("get_sweep(arg) returned no points: it returns a non-empty list of {dotted key: value}")
    base = [tuple((k, check_value(config, k, v)) for k, v in dict(p).items()) for p in file_points]
    clash = sorted({k for p in base for k, _ in p} & set(keys))
    if clash:
      raise SweepError(f"--sweep and the config's get_sweep both set {clash}")
  grid = list(itertools.product(*[[(k, v) for v in vs] for k, vs in axes]))
  return [b + tuple(g) for b in base for g in grid]


def swept_keys(points: list[tuple]) -> list[str]:
  return list(dict.fromkeys(k for p in points for k, _ in p))


def format_value(value) -> str:
  if isinstance(value, bool):
    return str(value).lower()
  if isinstance(value, float):
    return f"{value:g}"
  if isinstance(value, (tuple, list)):
    return "+".join(format_value(v) for v in value)
  return str(value)


def short_names(keys: list[str]) -> dict[str, str]:
  """Each dotted key's shortest trailing part that no other swept key ends with ('optim.lr' -> 'lr')."""
  out = {}
  for key in keys:
    parts = key.split(".")
    for n in range(1, len(parts) + 1):
      tail = ".".join(parts[-n:])
      if not any(o != key and (o == tail or o.endswith("." + tail)) for o in keys):
        break
    out[key] = tail
  return out


def run_name(point: tuple, seed: int | None, names: dict[str, str]) -> str:
  """A readable directory name: 'lr=0.001_gamma=0.5_seed=0' (characters other than [A-Za-z0-9.+=-] become '-')."""
  parts = [f"{names[k]}={format_value(v)}" for k, v in point]
  if seed is not None:
    parts.append(f"seed={seed}")
  text = "_".join(parts) or "base"
  return re.sub(r"[^A-Za-z0-9.+=_-]+", "-", text)


def runs_of(points: list[tuple], seeds: list[int] | None) -> list[Run]:
  """Every run, point by point (each point's seeds together). Names that coincide once made readable get a short
  hash of their point."""
  names = short_names(swept_keys(points))
  runs = [Run(i, p, s, run_name(p, s, names)) for i, p in enumerate(points) for s in (seeds or [None])]
  counts = {}
  for r in runs:
    counts[r.name] = counts.get(r.name, 0) + 1
  return [r if counts[r.name] == 1 else dataclasses.replace(
      r, name=f"{r.name}_{hashlib.sha256(repr(r.point).encode()).hexdigest()[:6]}") for r in runs]


def parse_shard(text: str) -> tuple[int, int]:
  """'I/N' -> (I, N) with 0 <= I < N."""
  try:
    i, n = (int(x) for x in text.split("/"))
  except ValueError:
    raise SweepError(f"--shard={text}: expected I/N, e.g. --shard=0/4 (this process runs every 4th point from "
                     f"point 0)") from None
  if n < 1 or not 0 <= i < n:
    raise SweepError(f"--shard={text}: I must be in [0, N) and N >= 1")
  return i, n


def select(runs: list[Run], num_points: int, index: int | None = None, shard: str = "") -> list[Run]:
  """The runs this invocation takes: every run; point `index` only (an array task); or every N-th point from I
  (`shard='I/N'`)."""
  if index is not None and shard:
    raise SweepError("--index and --shard together: --index=I runs point I (an array job's task), --shard=I/N runs "
                     "every N-th point; give one")
  if index is not None:
    if not 0 <= index < num_points:
      raise SweepError(f"--index={index} is past the last point: this sweep has {num_points} points, "
                       f"--index=0..{num_points - 1}")
    return [r for r in runs if r.index == index]
  if shard:
    i, n = parse_shard(shard)
    return [r for r in runs if r.index % n == i]
  return list(runs)


# --- the definition a workdir keeps ----------------------------------------------------------------------------
def definition(base_config, points: list[tuple], seeds: list[int] | None, validation: dict | None) -> dict:
  """What makes two sweeps the same: the base config (less the sections that change no result), the points, the
  seeds and the validation data. JSON-ready."""
  cfg = config_lib.to_json_dict(base_config)
  for section in NEUTRAL_SECTIONS:
    cfg.pop(section, None)
  return json.loads(json.dumps(dict(config=cfg, points=[[[k, v] for k, v in p] for p in points],
                                    seeds=seeds, validation=validation), default=str))


def definition_difference(stored: dict, current: dict) -> str:
  """'' when equal, else a few words on what differs."""
  if stored == current:
    return ""
  what = []
  if stored.get("points") != current.get("points"):
    what.append(f"points {_points_text(stored.get('points'))} -> {_points_text(current.get('points'))}")
  if stored.get("seeds") != current.get("seeds"):
    what.append(f"seeds {stored.get('seeds')} -> {current.get('seeds')}")
  if stored.get("validation") != current.get("validation"):
    what.append(f"validation {stored.get('validation')} -> {current.get('validation')}")
  a, b = _flat(stored.get("config", {})), _flat(current.get("config", {}))
  keys = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))
  if keys:
    what.append("config " + ", ".join(f"{k}: {a.get(k)!r} -> {b.get(k)!r}" for k in keys[:3])
                + (f" and {len(keys) - 3} more" if len(keys) > 3 else ""))
  return "; ".join(what)


def _points_text(points) -> str:
  if not points:
    return "[]"
  shown = ["{" + ", ".join(f"{k}={format_value(v)}" for k, v in p) + "}" for p in points[:3]]
  return f"[{', '.join(shown)}{', ...' if len(points) > 3 else ''}] ({len(points)})"


def _flat(d: dict, prefix: str = "") -> dict:
  out = {}
  for k, v in d.items():
    if isinstance(v, dict):
      out.update(_flat(v, f"{prefix}{k}."))
    else:
      out[f"{prefix}{k}"] = v
  return out


def apply(config, overrides: dict) -> ml_collections.ConfigDict:
  """A copy of `config` with dotted `overrides` set."""
  cfg = config.copy_and_resolve_references()
  return config_lib.set_dotted(cfg, overrides)
