"""qual.py: checkable items (arithmetic, JSON, agent-protocol cases), n of m (`rigstack qual`)."""

from rigstack.commands import entry
from rigstack.commands.qual import app

if __name__ == "__main__":
    entry(app)
