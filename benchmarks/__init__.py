"""Benchmarks (`make bench`): figures written as JSON under bench_results/ and printed as tables."""
