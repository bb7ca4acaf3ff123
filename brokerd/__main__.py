from brokerd.cli import main

raise SystemExit(main())
