from fuselab.cli import main

raise SystemExit(main())
