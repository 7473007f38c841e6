"""``hydra/sweeper=paiexp``: a Hydra app's sweep as a paiexp sweep (see paiexp.hydra_launch)."""
