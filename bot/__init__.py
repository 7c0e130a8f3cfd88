"""nodbot bot."""
