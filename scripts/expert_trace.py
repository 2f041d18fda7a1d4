"""expert_trace.py: per-layer hot sets from a running server's expert picks (`rigstack expert-trace`)."""

from rigstack.commands import entry
from rigstack.commands.expert_trace import app

if __name__ == "__main__":
    entry(app)
