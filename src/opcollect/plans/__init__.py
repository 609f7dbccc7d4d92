"""Plans: which cases each backend times on each SM, computed on the CPU without any framework."""
