"""``python -m celeryapp.interfaces.cli``: the ``chordbeat`` command without its script."""

from __future__ import annotations

from celeryapp.interfaces.cli import main

if __name__ == "__main__":
    main(prog_name="chordbeat")
