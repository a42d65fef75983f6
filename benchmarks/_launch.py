"""Run one command and report its own wall time and peak RSS, as one JSON line.

    python -I -S benchmarks/_launch.py STDOUT_FILE STDERR_FILE -- CMD [ARGS...]

Why a separate, tiny launcher rather than ``subprocess`` in the harness: on Linux a
child's ``ru_maxrss`` starts from the memory of the process it was forked from.
``subprocess`` (and ``posix_spawn``) use ``vfork``, so the child even inherits the
*peak* RSS of the parent: a harness that once held a large array would inflate every
later measurement. This launcher is started fresh with ``-I -S`` (a few MiB), forks
with a real ``fork`` and ``exec``s the command at once, so the command's ``ru_maxrss``
(from ``os.wait4``, which returns that one child's rusage) is its own peak, floored at
the launcher's few MiB. Wall time is taken around fork and wait, so the launcher's
own start-up is not counted.
"""

import json
import os
import sys
import time


def main() -> None:
    out_path, err_path, sep, *cmd = sys.argv[1:]
    if sep != "--" or not cmd:
        raise SystemExit("usage: _launch.py STDOUT STDERR -- CMD [ARGS...]")
    start = time.perf_counter()
    pid = os.fork()
    if pid == 0:  # the child: redirect, then become the command
        try:
            out = os.open(out_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            err = os.open(err_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            os.dup2(out, 1)
            os.dup2(err, 2)
            os.execv(cmd[0], cmd)
        finally:
            os._exit(127)
    _, status, usage = os.wait4(pid, 0)
    wall = time.perf_counter() - start
    print(json.dumps({
        "wall": wall,
        "maxrss_mib": usage.ru_maxrss / 1024,  # KiB on Linux
        "user": usage.ru_utime,
        "sys": usage.ru_stime,
        "rc": os.waitstatus_to_exitcode(status),
    }))


if __name__ == "__main__":
    main()
