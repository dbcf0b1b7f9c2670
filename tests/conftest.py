"""Tests run on 8 simulated CPU devices so that sharding is exercised without an accelerator."""

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402

jax.config.update("jax_num_cpu_devices", 8)

import absl.logging  # noqa: E402
import pytest  # noqa: E402

absl.logging.set_verbosity(absl.logging.WARNING)

from helpers import ROOT, load_config, tiny_clip_config  # noqa: E402,F401  (re-exported)


@pytest.fixture
def devices():
  assert len(jax.devices()) == 8, "tests expect 8 simulated CPU devices (tests/conftest.py)"
  return jax.devices()
