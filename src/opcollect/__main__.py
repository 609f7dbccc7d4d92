# `python -m` put the working directory first on sys.path: remove it before anything else is imported
from opcollect.safepath import drop_working_directory

drop_working_directory()

import os  # noqa: E402
import sys  # noqa: E402

from opcollect.cli import main  # noqa: E402

# Arrow's parquet thread pool can abort the interpreter's teardown after all the work is done ("terminate called
# without an active exception", exit -6; apache/arrow#34314); CI saw it in check and in collect. Every file is
# written atomically and every worker and container stopped before main returns, so the process leaves without
# that teardown once its output is flushed.
code = main()
sys.stdout.flush()
sys.stderr.flush()
os._exit(code if isinstance(code, int) else 1)
