"""Pretrained models in and out: OpenAI CLIP, open_clip, Hugging Face `CLIPModel` and MERU checkpoints.

Nothing is downloaded: a spec names a file or directory the user already has.

  openai:PATH                 OpenAI's released .pt (a TorchScript archive) or an OpenAI-layout state dict;
                              QuickGELU, as OpenAI trained them
  open_clip:PATH              an open_clip state dict (.pt / .bin / .safetensors) or an open_clip folder
  open_clip:NAME:PATH         (open_clip_config.json + weights, what `local-dir:` reads); the architecture comes from
                              the folder's config, else from the tensor shapes with OpenAI's head width 64, or from
                              NAME (e.g. ViT-H-14: head width 80); the activation is open_clip's default GELU unless
                              the config or NAME says quick_gelu (`ViT-B-32-quickgelu`)
  hf:DIR                      a transformers `CLIPModel` directory (config.json + model.safetensors, sharded
                              safetensors, or pytorch_model.bin)
  meru:PATH                   a facebookresearch/meru checkpoint (.pth with 'model'): timm ViT + MERU's text
                              encoder; Lorentz geometry with its curvature and scaling alphas (or, for MERU's CLIP
                              baseline checkpoints, the sphere)
  big_vision:PATH             a google-research/big_vision two-tower .npz (SigLIP): `params/img/...` (ViT with
  big_vision:SIZE:PATH        patch bias, learned position embedding or fixed 'sincos2d' — then SIZE, the image
                              resolution, is needed — 'map' (MAPHead_0), 'gap' or 'tok' pooling, a head with a
                              bias), `params/txt/...` (text transformer without causal mask, pooled at the final
                              position or by a MAP head), `params/t` (log temperature -> logit_scale) and `params/b`
                              (-> logit_bias); unrolled (`encoderblock_N`) or scanned (`encoderblock`) blocks; the
                              SentencePiece `.model` beside the file is its tokenizer

`load(spec) -> (model_config, params)`: `model_config` holds the `config.model` fields of the architecture
(`size='custom'`, widths, depths, heads, activation, ...) and `preprocess` (image size, mean/std, resize);
`params` is the nested dict of the TwoTower's parameters, float32. `load_model(spec) -> (model, preprocess,
tokenizer)` mirrors open_clip's `create_model_and_transforms`. `export(...)` writes an ncjax model back as an
open_clip folder or a Hugging Face directory. The same key tables serve both directions; every source key is
either mapped or explicitly ignored, and a shape mismatch names the key and both shapes.

One module per format (openai, open_clip, hf, meru, big_vision: each a `read(spec)` returning the state dict,
the model fields, the preprocessing and its key table), the shared vocabulary in core, the check and the overlay in
loading, the way back in export. Adding a format is one module and one entry in loading.READERS.
"""

from ncjax.pretrained import weights_io
from ncjax.pretrained.core import (FORMATS, PretrainedSpec, UnsupportedArchitecture, is_pretrained_spec,
                                    parse_spec)
from ncjax.pretrained.export import EXPORT_FORMATS, export
from ncjax.pretrained.loading import (PretrainedModel, apply_to_config, expected_shapes, load,
                                       load_model, overlay)
from ncjax.pretrained.weights_io import CheckpointFormatError

__all__ = ["load", "load_model", "export", "overlay", "parse_spec", "is_pretrained_spec", "apply_to_config",
           "expected_shapes", "PretrainedModel", "PretrainedSpec", "UnsupportedArchitecture", "CheckpointFormatError",
           "FORMATS", "EXPORT_FORMATS", "weights_io"]
