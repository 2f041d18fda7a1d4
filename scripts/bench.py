"""bench.py: single-stream decode by workload (`rigstack bench`)."""

from rigstack.commands import entry
from rigstack.commands.bench import app

if __name__ == "__main__":
    entry(app)
