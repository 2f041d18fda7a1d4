"""conc.py: concurrency sweep or open-loop rates (`rigstack conc`)."""

from rigstack.commands import entry
from rigstack.commands.conc import app

if __name__ == "__main__":
    entry(app)
