"""The threads of jobs that share this machine's CPUs.

OpenMP and BLAS libraries (XGBoost, NumPy) start one thread per core unless told otherwise:
N concurrent jobs doing so slow each other down several times over.
"""

from __future__ import annotations

THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")


def cpu_share(cpus: int, jobs: int) -> int:
    """Each of ``jobs`` concurrent jobs' equal share of ``cpus`` (at least one)."""
    return max(1, cpus // max(1, jobs))


def thread_environment(threads: int) -> dict[str, str]:
    """The variables that limit a job's OpenMP/BLAS threads to ``threads``."""
    return dict.fromkeys(THREAD_VARIABLES, str(threads))
