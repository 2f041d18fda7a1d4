"""apply.py: apply the patch stack to a vLLM package with git (`rigstack apply|check|status|...` is the same)."""

from rigstack.commands import entry
from rigstack.commands.stack import app

if __name__ == "__main__":
    entry(app)
