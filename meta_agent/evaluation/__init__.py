"""Playing trained roles on held-out problems: eval, the counterfactual probes, the planners (tree search, best of N), eval's tables."""
