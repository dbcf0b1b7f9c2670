"""configs for the plugin method `toy_hinge` (tests/plugins/toy_plugin.py): the arguments NC-bench passes
(ncjax.config_lib.BENCH_ARGUMENTS: data, noise, epochs, batch, model, init) plus its own margin."""

from ncjax import config_lib


def get_config(arg=None):
  a = config_lib.parse_arg(arg, model="micro", data="digits", noise=config_lib.optional(float), batch=64, epochs=1,
                           lr=1e-3, init="", margin=0.2)
  c = config_lib.base_config()
  c.method.name = "toy_hinge"
  config_lib.apply_common(c, model=a.model, data=a.data, batch=a.batch, epochs=a.epochs,
                          noise=config_lib.noise_for(a.data, a.noise, 0.4), lr=a.lr, init=a.init)
  c.loss.margin = a.margin
  config_lib.add_default_evals(c)
  return config_lib.lock(c)
