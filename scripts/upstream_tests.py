"""upstream_tests.py: vLLM's own tests of the touched modules, pristine against patched (`rigstack upstream-tests`)."""

from rigstack.commands import entry
from rigstack.commands.upstream_tests import app

if __name__ == "__main__":
    entry(app)
