"""compare.py: compare two result files (`rigstack compare`)."""

from rigstack.commands import entry
from rigstack.commands.compare import app

if __name__ == "__main__":
    entry(app)
