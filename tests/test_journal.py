"""The study journal is appended whole or not at all (paiexp.sweep.journal).

An append that fails on a full disk (a tmpfs of the test's own, filled) leaves the file as it
was, and a torn last record (a launcher killed mid-append) is cut off by the next append:
Optuna's own reader reads the file throughout.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import Any

import pytest
from conftest import fill_disk


def journal_study(path: Path) -> Any:
    import optuna

    from paiexp.sweep.study import create_storage

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna.create_study(
        study_name="s", storage=create_storage(str(path)), load_if_exists=True
    )


def read_by_optuna(path: Path) -> list[str]:
    """The trials' states as Optuna's plain journal reader sees the file."""
    import optuna
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend

    storage = JournalStorage(JournalFileBackend(str(path)))
    study = optuna.load_study(study_name="s", storage=storage)
    return [t.state.name for t in study.get_trials(deepcopy=False)]


def test_an_append_that_finds_the_disk_full_leaves_the_journal_as_it_was(
    small_disk: Path,
) -> None:
    path = small_disk / "optuna.journal"
    study = journal_study(path)
    trial = study.ask()
    before = path.read_bytes()
    fill_disk(small_disk)
    with pytest.raises(OSError) as raised:
        trial.set_user_attr("blob", "x" * 100_000)  # more than the page the file ends in
    assert raised.value.errno == errno.ENOSPC and raised.value.filename == str(path)
    assert path.read_bytes() == before
    assert read_by_optuna(path) == ["RUNNING"]
    (small_disk / "ballast").unlink()
    study.tell(trial, 1.0)
    assert read_by_optuna(path) == ["COMPLETE"]


def test_a_torn_last_record_is_cut_off_by_the_next_append(tmp_path: Path) -> None:
    path = tmp_path / "optuna.journal"
    study = journal_study(path)
    study.tell(study.ask(), 1.0)
    whole = path.read_bytes()
    with open(path, "ab") as journal:
        journal.write(b'{"op_code":5,"worker_id":"torn')  # no newline: a killed append
    assert read_by_optuna(path) == ["COMPLETE"]
    again = journal_study(path)  # a launcher started after the killed one
    again.tell(again.ask(), 2.0)
    assert path.read_bytes().startswith(whole) and b"torn" not in path.read_bytes()
    assert read_by_optuna(path) == ["COMPLETE", "COMPLETE"]
    assert os.path.getsize(path) > len(whole)
