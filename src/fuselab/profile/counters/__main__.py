"""`python -m fuselab.profile.counters --child SPEC --status STATUS`: the child that ncu starts (see child.py)."""

from fuselab.profile.counters.child import _main

if __name__ == "__main__":
    raise SystemExit(_main())
