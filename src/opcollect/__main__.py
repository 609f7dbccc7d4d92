# `python -m` put the working directory first on sys.path: remove it before anything else is imported
from opcollect.safepath import drop_working_directory

drop_working_directory()

from opcollect.cli import main  # noqa: E402

raise SystemExit(main())
