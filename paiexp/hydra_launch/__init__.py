"""Hydra apps as they are: ``hydra/launcher=paiexp`` runs each job of any ``@hydra.main``
app's multirun as a paiexp job (the plugin itself is ``hydra_plugins.paiexp_launcher``)."""
