"""Pure loss functions over the global batch. Each returns (loss, metrics) and computes in float32."""
