"""The shipped configs, package data: `--config=clip:model=small,noise=0.4` finds `ncjax/configs/clip.py` from any
directory (`ncjax.config_lib.find_config_file`); in a checkout, `configs/` at the repository root links here, so
`--config=configs/clip.py:...` keeps working. Each file defines `get_config(arg)`; they are loaded by path, never
imported as modules of this package."""
