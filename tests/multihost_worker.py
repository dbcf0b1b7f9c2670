"""One process of a 2-process CPU run (tests/test_multihost.py): train a few steps, save the gathered params."""

import sys


def main(process_id: int, num_processes: int, port: int, workdir: str, out: str, steps: int, devices: int):
  import jax
  from ncjax import runtime
  runtime.configure_cpu_devices(devices)
  jax.distributed.initialize(coordinator_address=f"127.0.0.1:{port}", num_processes=num_processes,
                             process_id=process_id)
  import absl.logging
  absl.logging.set_verbosity(absl.logging.WARNING)
  import numpy as np
  from jax.experimental import multihost_utils
  sys.path.insert(0, __file__.rsplit("/", 1)[0])
  from helpers import tiny_clip_config
  from ncjax import train
  assert jax.process_count() == num_processes and len(jax.devices()) == devices * num_processes
  cfg = tiny_clip_config(total_steps=steps)
  result = train.train(cfg, workdir)
  data = result.experiment.train_data
  # what this process fed each step: its part of the global batch (the test checks the parts against 1 process)
  np.save(f"{out}.process{jax.process_index()}.npy",
          np.stack([np.asarray(data.local_indices(s)) for s in range(steps)]))
  flat = {"/".join(str(k.key) for k in path): leaf
          for path, leaf in jax.tree_util.tree_flatten_with_path(result.params)[0]}
  gathered = {k: np.asarray(multihost_utils.process_allgather(v, tiled=True)) for k, v in flat.items()}
  if jax.process_index() == 0:
    np.savez(out, **gathered)


if __name__ == "__main__":
  a = sys.argv[1:]
  main(int(a[0]), int(a[1]), int(a[2]), a[3], a[4], int(a[5]), int(a[6]))
