"""Gradient caching (`optim.micro_batches=K`): memory per device against the global batch, step time against K = 1,
the largest global batch each CPU size trains within this machine's memory, and the K that fits NCU's paper preset
(ViT-B/16, global batch 2048) on one 80 GB accelerator.

Memory comes from XLA's analysis of the compiled step (`compiled.memory_analysis()`: the program's temporaries —
activations, gradients, the loss's B x B terms —, its arguments — the train state and the batch — and its outputs;
compiling allocates nothing, so sizes far beyond the machine are measured) and, where the step runs here, from the
peak resident memory of a process that ran it (each configuration in its own process). XLA:CPU's analysis is of
the program XLA:CPU would run; an accelerator's compiler fuses differently, so the 80 GB figure is an estimate of
the same program's footprint, not a measurement on the device.

  python -m benchmarks.run --suites=gradcache [--quick]
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import types

from benchmarks import common

GiB = 2 ** 30


def _program(config_name: str, arg: str, overrides: dict, devices, stage: int = 0):
  """(jitted step, abstract state, abstract batch) of a config's stage `stage`, built without its data."""
  import jax
  import jax.numpy as jnp
  from jax.sharding import NamedSharding, PartitionSpec as P
  from ncjax import config_lib, experiment, sharding as shard_lib, tokenizers, train
  cfg = config_lib.set_dotted(config_lib.load_config_file(config_name, arg), overrides)
  resolved = experiment.resolve(cfg)
  spec = resolved.model
  mesh = shard_lib.make_mesh(cfg.mesh, devices)
  from ncjax.models.microbatch import check_micro_batches
  check_micro_batches(cfg.input.global_batch_size, mesh.devices.size, cfg.optim.micro_batches)
  tok = (tokenizers.ClipBpeTokenizer(context_length=spec.context_length) if spec.tokenizer_kind == "clip_bpe" else
         tokenizers.WordTokenizer.build(["a photo of a cat"] * 4, context_length=spec.context_length))
  n = cfg.input.global_batch_size
  method = resolved.method(tokenizer=tok, num_examples=4 * n)
  exp = experiment.Experiment(cfg, resolved, mesh, tok, types.SimpleNamespace(steps_per_epoch=1000, num_examples=4 * n),
                              method, None, None)
  spans = train.stage_spans(method.stages(), 1000)
  abstract_params = method.abstract_params()
  param_sh = shard_lib.param_shardings(abstract_params, mesh)
  capacity = shard_lib.state_capacity(4 * n, mesh)
  ms_abstract = jax.eval_shape(lambda: method.init_state(capacity))
  ms_sh = shard_lib.state_shardings(ms_abstract, mesh, capacity)
  prog = train.StageProgram(exp, spans[stage], abstract_params, param_sh, ms_abstract, ms_sh)
  bsh = NamedSharding(mesh, P(tuple(mesh.axis_names)))
  size = spec.image_size
  batch = dict(image=jax.ShapeDtypeStruct((n, size, size, 3), jnp.float32, sharding=bsh),
               tokens=jax.ShapeDtypeStruct((n, spec.context_length), jnp.int32, sharding=bsh),
               id=jax.ShapeDtypeStruct((n,), jnp.int32, sharding=bsh),
               clean=jax.ShapeDtypeStruct((n,), jnp.bool_, sharding=bsh))
  return prog, mesh, batch


def compiled_memory(config_name: str, arg: str, overrides: dict, devices, stage: int = 0) -> dict:
  """Per-device bytes of the compiled step: temporaries, arguments, outputs (aliased donations counted once)."""
  import jax
  prog, mesh, batch = _program(config_name, arg, overrides, devices, stage)
  t0 = time.perf_counter()
  with jax.set_mesh(mesh):
    compiled = prog.step.lower(prog.abstract_state, batch).compile()
  mem = compiled.memory_analysis()
  temp, args, out = mem.temp_size_in_bytes, mem.argument_size_in_bytes, mem.output_size_in_bytes
  alias = getattr(mem, "alias_size_in_bytes", 0)
  return dict(temp_gib=temp / GiB, argument_gib=args / GiB, output_gib=out / GiB,
              peak_gib=(temp + args + out - alias) / GiB, compile_seconds=time.perf_counter() - t0)


def _child(arg_json: str) -> None:
  """A fresh process: run 3 steps of a config, print step time and peak RSS (the whole process)."""
  import resource
  spec = json.loads(arg_json)
  from ncjax import runtime
  runtime.configure_cpu_devices(8)
  from ncjax import config_lib
  cfg = config_lib.load_config_file(spec["config"], spec["arg"])
  with cfg.unlocked():
    cfg.optim.micro_batches = spec["k"]
    cfg.input.dataset = "synthetic"
    if not cfg.method.init_from:
      cfg.method.init_from = "random"   # timing and memory: any weights serve
  seconds = common.train_step_seconds(cfg, steps=2)
  peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
  print("RESULT " + json.dumps(dict(step_seconds=seconds, peak_rss_gib=peak / GiB)))


def measured(config: str, arg: str, k: int) -> dict:
  env = dict(os.environ, NCJAX_HUGE_PAGES="0")
  out = subprocess.run([sys.executable, "-m", "benchmarks.gradcache", json.dumps(dict(config=config, arg=arg, k=k))],
                       capture_output=True, text=True, env=env, timeout=3600)
  line = [l for l in out.stdout.splitlines() if l.startswith("RESULT ")]
  if not line:
    raise RuntimeError(out.stderr[-3000:])
  return json.loads(line[-1][len("RESULT "):])


def run(quick: bool = False, **_):
  import jax
  devices = jax.devices()
  rows = []
  # 1. Memory per device against the global batch, K = 1 and a fixed micro-batch of 32 per device.
  batches = (2048, 8192) if quick else (2048, 4096, 8192, 16384, 32768)
  for size in ("tiny", "small"):
    for n in batches:
      k = max(1, n // (len(devices) * 32))
      for kk in (1, k):
        arg = f"model={size},batch={n},noise=0"
        mem = compiled_memory("clip", arg, {"optim.micro_batches": kk}, devices)
        rows.append(dict(size=size, global_batch=n, micro_batches=kk, per_device_micro_batch=n // len(devices) // kk,
                         **mem))
  common.report("gradcache: compiled step memory per device (XLA:CPU's analysis; 8 devices)", rows, [
      ("size", "size", "s"), ("global_batch", "global batch", "d"), ("micro_batches", "K", "d"),
      ("per_device_micro_batch", "micro-batch / device", "d"), ("temp_gib", "temporaries GiB", ".2f"),
      ("argument_gib", "arguments GiB", ".3f"), ("peak_gib", "peak GiB", ".2f")])
  # 2. Step time and measured peak RSS, K against 1, at a batch the machine runs.
  arg = "model=small,batch=1024,noise=0" if quick else "model=small,batch=2048,noise=0"
  timing = []
  for k in (1, 4, 8):
    m = measured("clip", arg, k)
    timing.append(dict(config=f"clip:{arg}", micro_batches=k, **m))
  base = timing[0]["step_seconds"]
  for r in timing:
    r["vs_k1"] = r["step_seconds"] / base
  common.report("gradcache: CLIP `small` step time and peak RSS (each K in its own process, back to back)", timing, [
      ("micro_batches", "K", "d"), ("step_seconds", "step s", ".2f"), ("vs_k1", "vs K=1", ".2f"),
      ("peak_rss_gib", "peak RSS GiB", ".2f")])
  # 3. The largest global batch each CPU size trains within this machine's memory (compiled peak x devices).
  limit = float(os.environ.get("NCJAX_BENCH_MEMORY_GIB", "24"))
  largest = []
  for size in ("tiny", "small"):
    for mode in ("K=1", "micro-batch 32/device"):
      best, n = None, 1024
      while n <= (16384 if quick else 262144):
        k = 1 if mode == "K=1" else max(1, n // (len(devices) * 32))
        mem = compiled_memory("clip", f"model={size},batch={n},noise=0", {"optim.micro_batches": k}, devices)
        if mem["peak_gib"] * len(devices) > limit:
          break
        best, n = dict(global_batch=n, micro_batches=k, total_gib=mem["peak_gib"] * len(devices)), n * 2
      largest.append(dict(size=size, mode=mode, **(best or {})))
  common.report(f"gradcache: largest power-of-two global batch within {limit:g} GiB (compiled peak x 8 devices)",
                largest, [("size", "size", "s"), ("mode", "mode", "s"), ("global_batch", "global batch", "d"),
                          ("micro_batches", "K", "d"), ("total_gib", "GiB", ".1f")])
  # 4. NCU's paper preset (ViT-B/16, global batch 2048, bf16 towers) on one device: the unlearning stage.
  ncu = []
  for k in (1, 4, 8, 16, 32):   # also with --quick: it is the README's figure (a few ViT-B/16 compiles)
    mem = compiled_memory("ncu", "setting=paper,data=synthetic", {"optim.micro_batches": k}, devices[:1], stage=1)
    ncu.append(dict(micro_batches=k, **mem))
    if mem["peak_gib"] < 75:   # an 80 GB accelerator, with room for the runtime
      break
  common.report("gradcache: NCU paper preset (ViT-B/16, batch 2048, bf16), unlearning step on ONE device", ncu, [
      ("micro_batches", "K", "d"), ("temp_gib", "temporaries GiB", ".1f"), ("argument_gib", "arguments GiB", ".2f"),
      ("peak_gib", "peak GiB", ".1f"), ("compile_seconds", "compile s", ".0f")])
  common.write("gradcache", dict(memory=rows, timing=timing, largest=largest, ncu_paper=ncu))


if __name__ == "__main__":
  _child(sys.argv[1])
