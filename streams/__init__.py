"""Detection and root-cause analysis: the pure core and its Faust wiring."""
