"""probe_bang.py: the silent-corruption probe (`rigstack bang`)."""

from rigstack.commands import entry
from rigstack.commands.bang import app

if __name__ == "__main__":
    entry(app)
