"""Speed benchmarks: each prints measured ratios against a baseline run in the same process."""
