"""run_prod.py: start a profile's vLLM server and stop it later (`rigstack serve|stop`)."""

from rigstack.commands import entry
from rigstack.commands.serve import app

if __name__ == "__main__":
    entry(app)
