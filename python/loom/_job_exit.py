"""A rank that fails alone ends the whole job (See Note [Leaving the job] in
collectives/termination.cpp).

Under mpirun, a rank that raises out of the script would otherwise sit in MPI_Finalize (which is
collective) while the others wait for it in their next collective until LOOM_COMM_TIMEOUT. The
hook below prints the traceback as usual, then aborts the job (MPI_Abort) with a line naming the
exception, before the interpreter's teardown. ``sys.exit(n)`` with n != 0 is handled by loom's
exit handler in C++, which sees the exit status. One process, or an interactive session: the hook
only prints the traceback.
"""

import sys

from loom._loom import distributed as _d

_previous_excepthook = sys.excepthook


def _abort_on_uncaught(kind, value, tb):
    _previous_excepthook(kind, value, tb)
    if hasattr(sys, "ps1") or sys.flags.interactive or not _d._in_multi_rank_job():
        return
    status = 130 if issubclass(kind, KeyboardInterrupt) else 1
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # a closed or replaced stream must not stop the abort
            pass
    text = str(value)
    _d._abort_job(status, f"uncaught {kind.__name__}" + (f": {text}" if text else "") +
                  " (traceback above); the other ranks would wait for this one")


def install():
    """Chains sys.excepthook (once)."""
    if getattr(sys.excepthook, "__name__", "") != _abort_on_uncaught.__name__:
        sys.excepthook = _abort_on_uncaught
