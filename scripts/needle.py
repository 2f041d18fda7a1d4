"""needle.py: a planted fact in haystacks of several lengths and depths (`rigstack needle`)."""

from rigstack.commands import entry
from rigstack.commands.needle import app

if __name__ == "__main__":
    entry(app)
