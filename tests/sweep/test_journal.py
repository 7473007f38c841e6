"""The study journal is appended whole or not at all (paiexp.sweep.journal).

An append that fails on a full disk (a tmpfs of the test's own, filled) leaves the file as it
was, and a torn last record (a launcher killed mid-append) is cut off by the next append:
Optuna's own reader reads the file throughout.  The steps read from a job's log at once go in
one append, and only the records that create or end something are synced to the disk.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import Any

import optuna
import pytest
from conftest import fill_disk

from paiexp.sweep.journal import one_append
from paiexp.sweep.study import create_storage


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


@pytest.fixture
def journal(tmp_path: Path) -> Path:
    path = tmp_path / "optuna.journal"
    optuna.create_study(study_name="s", storage=create_storage(str(path)))
    return path


def study_at(path: Path) -> optuna.Study:
    return optuna.load_study(study_name="s", storage=create_storage(str(path)))


def steps_seen(path: Path, number: int) -> dict[int, float]:
    """The trial's intermediate values as another process's storage reads the file."""
    return dict(study_at(path).trials[number].intermediate_values)


def test_steps_reported_in_one_block_are_appended_together_as_it_ends(journal: Path) -> None:
    study = study_at(journal)
    trial = study.ask()
    lines = journal.read_bytes().count(b"\n")
    with one_append(study):
        for step in range(5):
            trial.report(1.0 / (step + 1), step)
        assert steps_seen(journal, trial.number) == {}  # held, not yet in the file
        assert journal.read_bytes().count(b"\n") == lines
        assert not trial.should_prune()  # the trial reads its own steps meanwhile
    assert steps_seen(journal, trial.number) == {s: 1.0 / (s + 1) for s in range(5)}
    assert journal.read_bytes().count(b"\n") == lines + 5

    trial.report(0.1, 5)  # outside a block: at once
    assert steps_seen(journal, trial.number)[5] == 0.1


def test_another_record_in_the_block_takes_the_held_steps_with_it_in_order(
    journal: Path,
) -> None:
    study = study_at(journal)
    trial = study.ask()
    with one_append(study):
        trial.report(0.5, 0)
        trial.set_user_attr("note", "after step 0")
        assert steps_seen(journal, trial.number) == {0: 0.5}
        trial.report(0.25, 1)
    records = journal.read_text().splitlines()
    assert '"step":0' in records[-3] and '"note"' in records[-2] and '"step":1' in records[-1]
    assert steps_seen(journal, trial.number) == {0: 0.5, 1: 0.25}


def test_only_records_that_create_or_end_something_are_synced(
    journal: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    synced: list[str] = []
    real_fsync = os.fsync

    def fsync(descriptor: int) -> None:
        synced.append(Path(f"/proc/self/fd/{descriptor}").resolve().name)
        real_fsync(descriptor)

    monkeypatch.setattr(os, "fsync", fsync)
    study = study_at(journal)
    trial = study.ask({"x": optuna.distributions.FloatDistribution(0, 1)})  # created: synced
    assert synced == ["optuna.journal"]
    trial.set_user_attr("job", "j-0")  # adds to the trial: synced with the next
    trial.report(0.5, 0)
    assert synced == ["optuna.journal"]
    study.tell(trial, 0.5)  # its end: synced, with what came before it
    assert synced == ["optuna.journal"] * 2
