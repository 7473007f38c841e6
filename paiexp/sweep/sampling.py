"""A seeded sampler that draws each trial's point from a seed of its own: (seed, trial number).

Optuna seeds a sampler once per process, so launchers sharing a study with the same
``sweep.sampler.seed`` start from the same state and propose the same points.  Trial numbers
are unique in the study's storage: a sampler seeded by (seed, number) for each trial keeps one
launcher's sweep reproducible, lets a resumed sweep go on with new points, and gives every
launcher sharing the study points of its own.  Each trial gets a fresh sampler built with the
configured options and that seed (public constructors only; samplers keep their state in the
study, so only in-process caches, such as GP's kernel warm start, are lost).
"""

from __future__ import annotations

import hashlib
import warnings
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from optuna.samplers import BaseSampler, BruteForceSampler

if TYPE_CHECKING:
    from optuna import Study
    from optuna.distributions import BaseDistribution
    from optuna.trial import FrozenTrial, TrialState


def trial_seed(seed: int, number: int) -> int:
    """The seed of trial ``number``'s sampler: a 32-bit digest of (seed, number)."""
    digest = hashlib.sha256(f"paiexp:{seed}:{number}".encode()).digest()
    return int.from_bytes(digest[:4], "big")


class TrialSeededSampler(BaseSampler):
    """Delegates each trial to ``build(trial_seed(seed, trial.number))``."""

    def __init__(self, build: Callable[[int], BaseSampler], seed: int) -> None:
        self._build = build
        self._seed = seed
        self._number = -1
        self._sampler: BaseSampler | None = None

    def _for(self, trial: FrozenTrial) -> BaseSampler:
        """The sampler of this trial (one launcher samples one trial at a time, in ``ask``)."""
        if self._sampler is None or self._number != trial.number:
            self._sampler = self._build(trial_seed(self._seed, trial.number))
            self._number = trial.number
        return self._sampler

    def infer_relative_search_space(
        self, study: Study, trial: FrozenTrial
    ) -> dict[str, BaseDistribution]:
        return self._for(trial).infer_relative_search_space(study, trial)

    def sample_relative(
        self, study: Study, trial: FrozenTrial, search_space: dict[str, BaseDistribution]
    ) -> dict[str, Any]:
        return self._for(trial).sample_relative(study, trial, search_space)

    def sample_independent(
        self,
        study: Study,
        trial: FrozenTrial,
        param_name: str,
        param_distribution: BaseDistribution,
    ) -> Any:
        return self._for(trial).sample_independent(study, trial, param_name, param_distribution)

    def before_trial(self, study: Study, trial: FrozenTrial) -> None:
        self._for(trial).before_trial(study, trial)

    def after_trial(
        self,
        study: Study,
        trial: FrozenTrial,
        state: TrialState,
        values: Sequence[float] | None,
    ) -> None:
        # Any instance will do (they differ only by seed): no new one for an earlier trial.
        (self._sampler or self._for(trial)).after_trial(study, trial, state, values)

    def reseed_rng(self) -> None:
        """Nothing to do: every trial is seeded by its number."""

    def __repr__(self) -> str:
        return f"TrialSeededSampler(seed={self._seed})"


class AskTellBruteForceSampler(BruteForceSampler):
    """Optuna's BruteForceSampler told trials outside ``study.optimize``: a grid tried in full
    leaves the end to ``sweep.n_trials`` instead of calling ``study.stop()``, which Optuna
    allows only inside an optimize loop (a launcher asks and tells)."""

    def __init__(self, seed: int | None = None, avoid_premature_stop: bool = False) -> None:
        from optuna.exceptions import ExperimentalWarning

        with warnings.catch_warnings():  # a grid sweep's user has nothing to do about it
            warnings.simplefilter("ignore", ExperimentalWarning)
            super().__init__(seed=seed, avoid_premature_stop=avoid_premature_stop)

    def after_trial(
        self,
        study: Study,
        trial: FrozenTrial,
        state: TrialState,
        values: Sequence[float] | None,
    ) -> None:
        super().after_trial(_Unstoppable(study), trial, state, values)  # type: ignore[arg-type]


class _Unstoppable:
    """A study whose ``stop`` does nothing; everything else is the study's."""

    def __init__(self, study: Study) -> None:
        self._study = study

    def __getattr__(self, name: str) -> Any:
        return getattr(self._study, name)

    def stop(self) -> None:
        """Nothing to stop: the launcher keeps to ``sweep.n_trials``."""
