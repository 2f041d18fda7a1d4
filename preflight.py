"""preflight.py: seconds-long checks of a host, a patched vLLM and weights against a profile (`rigstack preflight`)."""

from rigstack.commands import entry
from rigstack.commands.preflight import app

if __name__ == "__main__":
    entry(app)
