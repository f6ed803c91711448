"""Exit codes of ``python -m sweep.run`` that every executor acts on."""

EXIT_OK = 0  # done, diverged, or nothing to do (cancelled, not the current submission)
EXIT_FAILED = 1
EXIT_PREEMPTED = 75  # EX_TEMPFAIL: checkpointed on a stop signal; requeue me
