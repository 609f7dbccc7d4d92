from opcollect.cli import main

raise SystemExit(main())
