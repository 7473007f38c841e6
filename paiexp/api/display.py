"""One status line kept current where a Python program shows things: in a Jupyter notebook an
output replaced in place, in a terminal its line rewritten, in a log file a line each time
it changes.  The Python API's compact progress (the command line has its own, rich one)."""

from __future__ import annotations

import sys
from typing import IO, Any


class StatusLine:
    """Shows the latest of a sequence of one-line texts."""

    def __init__(self, stream: IO[str] | None = None) -> None:
        self.stream = stream or sys.stderr
        self._notebook = _notebook_output()
        self._shown: str | None = None

    def show(self, text: str) -> None:
        if text == self._shown:
            return
        if self._notebook is not None:
            self._notebook.update({"text/plain": text}, raw=True)
        elif self.stream.isatty():
            self.stream.write(f"\r\x1b[2K{text}")
            self.stream.flush()
        else:
            print(text, file=self.stream, flush=True)
        self._shown = text

    def close(self) -> None:
        """The last text stays; a terminal's cursor goes to the next line."""
        if self._notebook is None and self._shown is not None and self.stream.isatty():
            print(file=self.stream, flush=True)


def _notebook_output() -> Any:
    """An output of the running notebook cell that can be replaced, or None outside a
    notebook's kernel (IPython is not imported here unless the program already did)."""
    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None else None
    if shell is None or not hasattr(shell, "kernel"):
        return None
    from IPython.display import display

    return display({"text/plain": ""}, raw=True, display_id=True)
