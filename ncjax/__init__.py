"""ncjax: vision-language contrastive learning under noisy correspondence, and unlearning, in JAX/Flax."""

__version__ = "0.1.0"
