"""ncjax.compat: the XLA flags each jaxlib accepts (jaxlib 0.11 aborts the process on a flag it does not know), and
flags the user set left alone."""

from ncjax import compat


def test_the_loop_emitter_flag_only_for_jaxlib_before_0_11(monkeypatch):
  monkeypatch.setattr(compat, "jaxlib_version", lambda: (0, 10, 2))
  assert "--xla_cpu_use_fusion_emitters=false" in compat.fast_compile_xla_flags()
  for newer in ((0, 11, 0), (0, 11, 2)):
    monkeypatch.setattr(compat, "jaxlib_version", lambda v=newer: v)
    flags = compat.fast_compile_xla_flags()
    assert flags == ("--xla_backend_optimization_level=0", "--xla_cpu_parallel_codegen_split_count=1")


def test_versions_parse_and_the_installed_one_is_admitted():
  assert compat._parse("0.11.2") == (0, 11, 2) and compat._parse("0.10.2.dev20260101") == (0, 10, 2)
  assert compat._parse("1.0") == (1, 0, 0)
  assert compat.OLDEST <= compat.jaxlib_version() < compat.NEWER_THAN_PROVEN


def test_flags_the_user_set_win():
  current = "--xla_backend_optimization_level=3 --foo=1"
  out = compat.with_xla_flags(current, ("--xla_backend_optimization_level=0", "--bar=2"))
  assert out == "--xla_backend_optimization_level=3 --foo=1 --bar=2"
