# `python -m` put the working directory first on sys.path: remove it before anything else is imported
from opcollect.safepath import drop_working_directory

drop_working_directory()

import os  # noqa: E402
import sys  # noqa: E402

from opcollect.cli import main  # noqa: E402

# Verbs that only read tables and print. Arrow's parquet thread pool can abort the interpreter's teardown after all
# the work is done ("terminate called without an active exception", exit -6; apache/arrow#34314), which CI saw
# twice in `check`: these verbs leave without that teardown, their output flushed. Verbs that write or start
# processes exit normally.
READ_ONLY = ("check", "verify", "compare")

code = main()
if sys.argv[1:2] and sys.argv[1] in READ_ONLY:
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code if isinstance(code, int) else 1)
raise SystemExit(code)
