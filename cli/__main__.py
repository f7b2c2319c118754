from irpe.cli import main

raise SystemExit(main())
