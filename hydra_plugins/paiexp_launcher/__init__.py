"""``hydra/launcher=paiexp``: a Hydra multirun's jobs as paiexp jobs (see paiexp.hydra_launch)."""
