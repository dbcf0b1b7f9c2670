"""Named model sizes. CLIP sizes follow the OpenAI architectures; `tiny` and `small` are for CPU runs."""

from __future__ import annotations

CLIP_TEXT = dict(width=512, depth=12, heads=8, context_length=77, vocab_size=49408)

SIZES: dict[str, dict] = {
    "ViT-B/16": dict(embed_dim=512, image=dict(image_size=224, patch_size=16, width=768, depth=12, heads=12),
                     text=dict(CLIP_TEXT)),
    "ViT-B/32": dict(embed_dim=512, image=dict(image_size=224, patch_size=32, width=768, depth=12, heads=12),
                     text=dict(CLIP_TEXT)),
    "ViT-L/14": dict(embed_dim=768, image=dict(image_size=224, patch_size=14, width=1024, depth=24, heads=16),
                     text=dict(width=768, depth=12, heads=12, context_length=77, vocab_size=49408)),
    # CPU sizes: vocabulary and context come from the tokenizer / data (word-level vocabularies are small).
    "small": dict(embed_dim=128, image=dict(image_size=32, patch_size=4, width=128, depth=4, heads=4),
                  text=dict(width=128, depth=4, heads=4, context_length=32, vocab_size=None)),
    "tiny": dict(embed_dim=64, image=dict(image_size=16, patch_size=4, width=64, depth=2, heads=2),
                 text=dict(width=64, depth=2, heads=2, context_length=16, vocab_size=None)),
    # tiny with a 4-block image tower: NC-bench's and the demo's digits model. On clean digits captions (40 epochs)
    # tiny's 2-block image tower reaches 89-90% zero-shot and a linear probe of 95%; 4 blocks reach 93-95% zero-shot.
    "tiny_deep": dict(embed_dim=64, image=dict(image_size=16, patch_size=4, width=64, depth=4, heads=2),
                      text=dict(width=64, depth=2, heads=2, context_length=16, vocab_size=None)),
    # tiny_deep on the embedded scenes (ncjax/data/embedded/scenes.py): 24 px scenes in 16 patches of 6 px, a context of 40 word
    # tokens, which holds every scenes caption (at most 30 words) with NCU's 8 prompt tokens and the end-of-text token.
    "tiny_scenes": dict(embed_dim=64, image=dict(image_size=24, patch_size=6, width=64, depth=4, heads=2),
                        text=dict(width=64, depth=2, heads=2, context_length=40, vocab_size=None)),
    # tiny with one block per tower: smoke runs and the test suite. XLA compiles the blocks unrolled, so compile
    # time grows with depth, and short runs are compile-bound: a tiny trainer's step compiles in about half the time
    # at depth 1 and `make test` runs ~1.5x faster. One block still has every layer kind (attention, MLP, norms).
    "micro": dict(embed_dim=64, image=dict(image_size=16, patch_size=4, width=64, depth=1, heads=2),
                  text=dict(width=64, depth=1, heads=2, context_length=16, vocab_size=None)),
    # Region-feature retrieval (ncjax.models.sgraf; image_type 'regions'): embed_dim is SGRAF's joint space, the
    # region feature size and the similarity head live in model.region. image_size is unused (features, not pixels).
    "sgraf": dict(embed_dim=1024, image=dict(image_size=0), text=dict(context_length=48, vocab_size=None)),
    "sgraf_small": dict(embed_dim=64, image=dict(image_size=0), text=dict(context_length=16, vocab_size=None)),
}


# 'custom'': every field comes from the config (model.embed_dim, image_*, text_*), as an imported checkpoint sets them.
CUSTOM = "custom"


def get_size(name: str) -> dict:
  if name == CUSTOM:
    return dict(embed_dim=None, image=dict(image_size=None, patch_size=None, width=None, depth=None, heads=None),
                text=dict(width=None, depth=None, heads=None, context_length=None, vocab_size=None))
  if name not in SIZES:
    raise ValueError(f"unknown model size {name!r}; known sizes: {sorted(SIZES) + [CUSTOM]}")
  spec = SIZES[name]
  return dict(embed_dim=spec["embed_dim"], image=dict(spec["image"]), text=dict(spec["text"]))
