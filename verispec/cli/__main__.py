"""`python -m verispec.cli ...` is `verispec ...`."""

from verispec.cli import main

raise SystemExit(main())
