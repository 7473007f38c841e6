"""A study storage on a database server that rides out the server's brief outages.

:class:`PatientStorage` wraps the storage Optuna itself would use for an RDB URL (its cached
RDB storage) and sends every call through an :class:`~paiexp.util.outage.Outage`: while the
database is down, the call that found it so is tried again, and the launcher's loop waits in
it; the jobs run on by themselves, so a trial that finished meanwhile is told once the
database is back, and none is lost.  Reads are idempotent; so are Optuna's writes of values
and attributes.  Telling a trial whose first try reached the database before the answer was
lost finds it finished with the same state and values: that is success, not another
launcher's doing.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from optuna.storages import BaseStorage

if TYPE_CHECKING:
    from optuna.trial import TrialState

    from paiexp.util.outage import Outage


class PatientStorage(BaseStorage):
    """Every :class:`BaseStorage` method of ``storage``, tried again through ``outage``."""

    def __init__(self, storage: BaseStorage, outage: Outage) -> None:
        self.storage = storage
        self.outage = outage

    def set_trial_state_values(
        self, trial_id: int, state: TrialState, values: Sequence[float] | None = None
    ) -> bool:
        from optuna.exceptions import UpdateFinishedTrialError

        tries = 0

        def attempt() -> bool:
            nonlocal tries
            tries += 1
            try:
                return self.storage.set_trial_state_values(trial_id, state, values)
            except UpdateFinishedTrialError:
                if tries > 1 and self._stored(trial_id, state, values):
                    return True  # the try the outage cut short had done it
                raise

        return self.outage.call(attempt)

    def _stored(self, trial_id: int, state: TrialState, values: Sequence[float] | None) -> bool:
        trial = self.storage.get_trial(trial_id)
        return trial.state == state and (values is None or trial.values == list(values))


def outage_of(storage: BaseStorage) -> Outage | None:
    """The outage a study storage rides out, if it is patient."""
    return storage.outage if isinstance(storage, PatientStorage) else None


def _patient(name: str) -> Callable[..., Any]:
    def method(self: PatientStorage, *args: Any, **kwargs: Any) -> Any:
        call = getattr(self.storage, name)
        return self.outage.call(lambda: call(*args, **kwargs))

    method.__name__ = name
    method.__doc__ = f"``{name}`` of the wrapped storage, through the outage."
    return method


# Every public method of BaseStorage (those it implements too: the wrapped storage may do
# them better, as Optuna's cache does), except the ones written out above.  Made here, they
# are invisible to mypy, which takes the class for abstract.
for _name, _value in vars(BaseStorage).items():
    if callable(_value) and not _name.startswith("_") and _name not in vars(PatientStorage):
        setattr(PatientStorage, _name, _patient(_name))
abc.update_abstractmethods(PatientStorage)  # type: ignore[type-abstract]  # now concrete
