"""The datasets embedded in ncjax — generated on the machine, nothing downloaded — for the demo, the tests and
NC-bench's examples.

  digits             8 x 8 scikit-learn digits with templated captions (the demo's data)
  scenes             rendered scenes whose captions fit only their own image (web data's regime)
  synthetic          random pairs for benchmarks and smoke runs
  precomp_synthetic  NCR's precomputed region-feature layout, synthetic (region models' tests and demo)
"""
